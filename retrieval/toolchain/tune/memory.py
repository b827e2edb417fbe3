"""The tuner's choice within the memory budget (retrieval/memory_budget.py), from memory it measured.

What a configuration costs is measured, not guessed from file sizes: the process's resident memory
grows by so much while its sessions open and run once (`rss_mb`; the tuner opens one configuration
at a time and closes it, freed pages trimmed back to the system, before the next opens, so each
growth is that configuration's own and the tuner's peak is its base plus the largest one). On an AMX Xeon three OpenVINO
bf16 ViT-B-16 image sessions took ~2.1 GB against a 329 MB fp32 weight file, where the weight files
suggested ~0.5 GB (BENCHMARKS.md, issue 24).

Two levers, in this order: per tower the candidate (backend × precision) — the combination of the two
towers whose least memory fits (the shared configuration where the backend shares weights, else its
copy-per-session one) and loses least speed (the product of the towers' scores); then prepacked
shapes are dropped, the smallest measured gain first.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from retrieval.memory_budget import Budget
from retrieval.toolchain.gate import Candidate
from retrieval.tuning import TowerChoice

Ranked = list[tuple[float, Candidate]]  # (score: 1.0 = fastest at every shape, candidate), best first


def rss_mb() -> float:
    """This process's resident memory in MB (Linux's /proc; 0.0 where there is none)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def _status_mb(field: str, pid: int | str = "self") -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def peak_rss_mb(pid: int | str = "self") -> float:
    """A process's (this one's) peak resident memory in MB since it started or `reset_peak_rss` (VmHWM)."""
    return _status_mb("VmHWM", pid)


def reset_peak_rss() -> bool:
    """Start the peak (VmHWM) again from the current resident memory (Linux: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class TowerMemory:
    """What a chosen tower's sessions cost, MB: the shared copy once (sharing backends), and each
    shape's own session (prepacked, or every shape where the backend cannot share)."""

    shares: bool
    shared_mb: float
    per_shape_mb: float
    dynamic_mb: float = 0.0  # the one shape-dynamic session of a stream (its own prepacked copy)


def fit_towers(
    ranked: dict[str, Ranked], need: Callable[[str, Candidate], float], budget: Budget
) -> tuple[dict[str, Candidate], list[str]]:
    """One candidate per tower: of the combinations whose least memory (`need`) fits the budget, the
    one with the smallest product of scores (none fits: the smallest memory); notes say what gave
    way and why."""
    towers = list(ranked)
    combos = [dict(zip(towers, combo, strict=True)) for combo in itertools.product(*ranked.values())]

    def total(combo: dict[str, tuple[float, Candidate]]) -> float:
        return sum(need(t, c) for t, (_, c) in combo.items())

    fitting = [combo for combo in combos if budget.allows(total(combo))]
    if fitting:
        best = min(fitting, key=lambda combo: math.prod(score for score, _ in combo.values()))
    else:
        best = min(combos, key=total)
    notes = []
    for tower, (score, chosen) in best.items():
        top = ranked[tower][0][1]
        if chosen is not top:
            notes.append(
                f"{top.label} {tower}: its sessions took {need(tower, top):.0f} MB here, over the memory budget "
                f"({budget.source}) beside the other tower; {chosen.label} instead "
                f"({need(tower, chosen):.0f} MB, {score:.2f}× the fastest)"
            )
    return {t: c for t, (_, c) in best.items()}, notes


def fit_prepacks(
    choices: dict[str, TowerChoice],
    memory: dict[str, TowerMemory],
    budget: Budget,
    per_shape: dict[str, TowerChoice] | None = None,
) -> dict[str, TowerChoice]:
    """Drop prepacked shapes, the smallest gain first, until the towers' sessions fit the budget: first
    those beside a one shape-dynamic session; then a tower on that one session per stream (its own
    copy) that still does not fit goes to its per-shape sessions (`per_shape[tower]`), whose
    prepacked shapes are then dropped as any."""

    def total() -> float:
        mb = 0.0
        for tower, choice in choices.items():
            cost = memory[tower]
            own = sum(v.prepack for v in choice.shapes.values())
            if choice.dynamic:
                mb += (cost.dynamic_mb + cost.per_shape_mb * own) * choice.streams
                continue
            if not cost.shares:
                mb += cost.per_shape_mb * choice.streams * max(len(choice.shapes), 1)
                continue
            shared = any(not v.prepack for v in choice.shapes.values()) or not choice.shapes
            mb += (cost.shared_mb if shared else 0.0) + cost.per_shape_mb * choice.streams * own
        return mb

    def drop(towers: list[str]) -> None:
        ranked = sorted(
            ((v.prepack_gain or 1.0, t, k) for t in towers for k, v in choices[t].shapes.items() if v.prepack),
            key=lambda item: item[0],
        )
        for _gain, tower, key in ranked:
            if budget.allows(total()):
                return
            shapes = dict(choices[tower].shapes)
            shapes[key] = shapes[key].model_copy(update={"prepack": False})
            choices[tower] = choices[tower].model_copy(update={"shapes": shapes})

    choices = dict(choices)
    drop([t for t, c in choices.items() if c.dynamic])
    for tower in sorted(choices, key=lambda t: -memory[t].dynamic_mb):
        if budget.allows(total()):
            return choices
        if choices[tower].dynamic and per_shape and tower in per_shape:
            choices[tower] = per_shape[tower]
    drop(list(choices))
    return choices
