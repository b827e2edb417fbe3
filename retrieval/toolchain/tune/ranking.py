"""How the tuner ranks what it measured: the candidate per tower, and how its sessions hold weights
(shared, prepacked per shape, or one shape-dynamic session) — from the per-shape times alone."""

from __future__ import annotations

import math
from collections.abc import Callable

from retrieval.errors import ModelError
from retrieval.toolchain.gate import Candidate
from retrieval.tuning import Shape, ShapeChoice

PREPACK_GAIN = 1.05  # a prepacked copy is kept only when it is at least this much faster
MODES = ("shared", "prepacked", "own", "dynamic")  # how a configuration's sessions hold weights (measure.py)
BATCHED_PREPACK_GAIN = 1.3  # `latency`: a batched shape's prepacked copy only at this gain (see shape_choices)


def _fastest_pass(values: list[float]) -> float:
    """A configuration's time at a shape, from its passes' medians: the fastest pass. Every pass opens
    the configuration afresh, and what differs between passes only slows one down — other work, and on
    some hosts a session drawn slow for its whole life when it opens (~1.45× on an AVX-512 EPYC VM,
    BENCHMARKS.md, issue 34) — so the fastest pass is the nearest to what the configuration does; the
    median of two passes is their mean, half a slow draw."""
    return min(values)


def _geometric_mean(ratios: list[float]) -> float:
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def rank_tower(
    tower: str,
    options_: list[Candidate],
    samples: dict[tuple[str, Shape, str], list[float]],
    shapes_of: Callable[[Candidate], list[Shape]],
) -> list[tuple[float, Candidate]]:
    """Every measured candidate with its score, best first: the geometric mean over the tower's shapes
    of its time ÷ the shape's fastest (1.0: fastest everywhere)."""
    measured = [c for c in options_ if all(_best_ms(samples, tower, c, s) < math.inf for s in shapes_of(c))]
    if not measured:
        raise ModelError(f"no configuration of the {tower} tower could be measured")
    fastest: dict[Shape, float] = {}
    for c in measured:
        for s in shapes_of(c):
            fastest[s] = min(fastest.get(s, math.inf), _best_ms(samples, tower, c, s))

    def score(c: Candidate) -> float:
        return _geometric_mean([_best_ms(samples, tower, c, s) / fastest[s] for s in shapes_of(c)])

    # Ties keep the backend's order of preference (sorted is stable).
    return sorted(((score(c), c) for c in measured), key=lambda sc: sc[0])


def _best_ms(samples: dict[tuple[str, Shape, str], list[float]], tower: str, c: Candidate, shape: Shape) -> float:
    times = [_fastest_pass(v) for m in MODES if (v := samples.get((tower, shape, f"{c.label} {m}")))]
    return min(times) if times else math.inf


def shape_choices(
    tower: str,
    winner: Candidate,
    samples: dict[tuple[str, Shape, str], list[float]],
    shapes: list[Shape],
    objective: str = "latency",
) -> dict[Shape, ShapeChoice]:
    """Per shape of the chosen candidate: prepacked where that is at least PREPACK_GAIN faster; for
    `latency`, a batched shape only where it is at least BATCHED_PREPACK_GAIN faster. Batched shapes
    of a search service run when queries arrive together, beside the batch-1 sessions, and there a
    small gain alone can turn into a loss: on the AMX Xeon, text at concurrency 8 over HTTP had p50
    53 ms with b1, b1.l16 and b8.l16 prepacked, 22.5 ms with b1 and b1.l16 only (26 ms shipped),
    though b8.l16 alone ran 17.5 against 22.1 ms, a 1.26× gain (BENCHMARKS.md, issue 24). On the
    AVX-512 EPYC prepacked batched text gained 1.3–3.9× and leaving it shared made throughput fall as
    concurrency rose (issue 34). So a batched shape is prepacked for `latency` from a 1.3× gain, and
    the validation (validate.py: a `cnclip worker` over HTTP, concurrency 1 and 8, against the
    defaults) is what catches a tower where it still loses. `throughput` (bulk indexing) prepacks
    every shape that gains PREPACK_GAIN."""
    out: dict[Shape, ShapeChoice] = {}
    for s in shapes:
        shared = samples.get((tower, s, f"{winner.label} shared"))
        packed = samples.get((tower, s, f"{winner.label} prepacked"))
        if shared and packed:
            gain = _fastest_pass(shared) / _fastest_pass(packed)
            needed = PREPACK_GAIN if objective == "throughput" or s[0] == 1 else BATCHED_PREPACK_GAIN
            keep = gain >= needed
            # The time of what runs: a gain too small to keep is not had.
            ms = _fastest_pass(packed) if keep else _fastest_pass(shared)
            out[s] = ShapeChoice(prepack=keep, ms=round(ms, 3), prepack_gain=round(gain, 3))
        else:
            out[s] = ShapeChoice(prepack=False, ms=round(_best_ms(samples, tower, winner, s), 3))
    return out


def one_session(
    tower: str, winner: Candidate, samples: dict[tuple[str, Shape, str], list[float]], shapes: dict[Shape, ShapeChoice]
) -> dict[Shape, ShapeChoice] | None:
    """The shapes as the candidate's one shape-dynamic session runs them, when that session is chosen
    over the per-shape sessions of `shape_choices`; None when it is not (or was not measured).

    It is chosen unless the per-shape choice is faster by PREPACK_GAIN on the geometric mean over
    the shapes: besides the bucket shapes measured here it runs every batch size between them
    unpadded (a per-shape choice pads 2–7 rows up to 8), with one prepacked copy per stream where a
    per-shape choice holds one per prepacked shape; and it is what `serve` runs by default, which a
    per-shape choice lost to over HTTP 1.3–1.5× on the AVX-512 EPYC (BENCHMARKS.md, issue 34).

    A batch-1 shape that its own prepacked session runs PREPACK_GAIN faster than the one session
    runs there, beside it (`beside_one_session`): on an AVX2 EPYC the one session took image b1
    181–212 ms against 133–145 ms static and prepacked, while winning at b16 (BENCHMARKS.md)."""
    label = f"{winner.label} dynamic"
    times = {s: samples.get((tower, s, label)) for s in shapes}
    if not times or not all(times.values()):
        return None
    one = {s: ShapeChoice(prepack=False, ms=round(_fastest_pass(v), 3)) for s, v in times.items() if v}
    for s in [s for s in one if beside_one_session(tower, s)]:
        if not (packed := samples.get((tower, s, f"{winner.label} prepacked"))):
            continue
        own_ms = _fastest_pass(packed)
        if (gain := (one[s].ms or 0.0) / own_ms) >= PREPACK_GAIN:
            one[s] = ShapeChoice(prepack=True, ms=round(own_ms, 3), prepack_gain=round(gain, 3))
    ratios = [ms / one_ms for s in one if (ms := shapes[s].ms) and (one_ms := one[s].ms)]  # per-shape ÷ one
    if ratios and _geometric_mean(ratios) * PREPACK_GAIN < 1.0:
        return None
    return one


def beside_one_session(tower: str, shape: Shape) -> bool:
    """Whether a shape can run on its own static session beside the stream's one shape-dynamic
    session: batch 1 (a batch goes to the smallest bucket that holds it, so only single rows reach
    it and the one session still takes every other size unpadded) of a tower without a text length
    axis (the one session runs text at its batch's own width; a static text session would get only
    its exact width, and would cost the stream those free widths)."""
    return shape[0] == 1 and tower != "text"
