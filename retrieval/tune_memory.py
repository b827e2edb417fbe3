"""The tuner's choice within the memory budget (retrieval/memory_budget.py).

Two levers, in this order: per tower the candidate (backend × precision) — the combination of the
two towers whose least memory fits (one copy where the backend shares weights, else one per batch
bucket and text length, as OpenVINO holds them) and loses least speed (the product of the towers'
scores); then prepacked shapes are dropped, the smallest measured gain first.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from retrieval.gate import Candidate
from retrieval.memory_budget import Budget
from retrieval.tuning import TowerChoice

Ranked = list[tuple[float, Candidate]]  # (score: 1.0 = fastest at every shape, candidate), best first


def least_mb(candidate: Candidate, shapes: int, copy_mb: float) -> float:
    """The fewest MB a tower's weights can take on `candidate`: one copy if it shares, else one per shape."""
    return copy_mb if candidate.backend.shares_weights(candidate.device) else shapes * copy_mb


def fit_towers(
    ranked: dict[str, Ranked],
    shapes_of: Callable[[str, Candidate], int],
    copy_mb_of: Callable[[str, Candidate], float],
    budget: Budget,
) -> tuple[dict[str, Candidate], list[str]]:
    """One candidate per tower: of the combinations whose least memory fits the budget, the one with
    the smallest product of scores (none fits: the smallest memory); notes say what gave way and why."""
    towers = list(ranked)

    def need(tower: str, c: Candidate) -> float:
        return least_mb(c, shapes_of(tower, c), copy_mb_of(tower, c))

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
                f"{top.label} {tower}: its sessions would hold {need(tower, top):.0f} MB of weight copies, over the "
                f"memory budget ({budget.source}) beside the other tower; {chosen.label} instead "
                f"({need(tower, chosen):.0f} MB, {score:.2f}× the fastest)"
            )
    return {t: c for t, (_, c) in best.items()}, notes


def fit_prepacks(
    choices: dict[str, TowerChoice], copy_mb: dict[str, float], shares: dict[str, bool], budget: Budget
) -> dict[str, TowerChoice]:
    """Drop prepacked shapes, the smallest gain first, until the weight copies fit the budget.
    `shares[tower]`: whether its backend shares one copy at all (else every shape holds its own)."""

    def total() -> float:
        mb = 0.0
        for tower, choice in choices.items():
            if not shares[tower]:
                mb += copy_mb[tower] * choice.streams * max(len(choice.shapes), 1)
                continue
            shared = any(not v.prepack for v in choice.shapes.values()) or not choice.shapes
            own = sum(v.prepack for v in choice.shapes.values())
            mb += copy_mb[tower] * ((1 if shared else 0) + choice.streams * own)
        return mb

    ranked = sorted(
        ((v.prepack_gain or 1.0, t, k) for t, c in choices.items() for k, v in c.shapes.items() if v.prepack),
        key=lambda item: item[0],
    )
    for _gain, tower, key in ranked:
        if budget.allows(total()):
            break
        shapes = dict(choices[tower].shapes)
        shapes[key] = shapes[key].model_copy(update={"prepack": False})
        choices[tower] = choices[tower].model_copy(update={"shapes": shapes})
    return choices
