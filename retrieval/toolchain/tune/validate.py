"""Before the tuning file is written: the choice against the defaults, as `serve` runs them.

The per-shape measurements time sessions alone; a search service runs them beside each other, behind
the dynamic batcher, with preprocessing on the same cores — where a choice that won alone can lose
(prepacked b8 text beside b1 doubled p50 at concurrency 8 on an AMX Xeon, issue 24). So the choice is
run through the same `LocalEncoder`, plan, session construction, batcher and preprocessing that
`serve` builds from a tuning file, against the same encoder without one, with closed-loop clients at
concurrency 1 and 8 (retrieval/toolchain/bench.py). In-process, not over HTTP: the HTTP layer is
the same code for both, and leaving it out keeps a second process's CPU out of a 2-core machine's
measurement. One encoder open at a time (the memory bound of the tuner), in `PASSES` passes of
alternating order (default, tuned; tuned, default); items/s is the median over the passes.

A tower keeps its choice when it is faster — the geometric mean of its items/s ratios (tuned ÷
default) over the two concurrencies above 1.0 — and loses by no more than `LOSS_TOLERANCE` at either;
otherwise the tower runs the defaults, recorded as such in the file.
"""

from __future__ import annotations

import asyncio
import gc
import math
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from retrieval.config import RuntimeSettings
from retrieval.encoder import LocalEncoder
from retrieval.manifest import ModelManifest
from retrieval.memory import trim_heap
from retrieval.toolchain.bench import image_payloads, measure, text_payloads
from retrieval.tower_plan import TowerPlan
from retrieval.tuning import ShapeChoice, TowerChoice, TuningFile, ValidationPoint, parse_shape_key, write_tuning

CONCURRENCIES = (1, 8)
PASSES = 2
LOSS_TOLERANCE = 0.95  # a choice slower than this × the default at either concurrency is not kept

Rates = dict[tuple[str, int], list[float]]  # (tower, concurrency) -> items/s per pass


def same_as_default(choice: TowerChoice, plan: TowerPlan) -> bool:
    """The choice opens what the defaults open (then there is nothing to compare)."""
    packed = frozenset(parse_shape_key(k) for k, v in choice.shapes.items() if v.prepack)
    default_packed = plan.prepack if plan.share else frozenset(parse_shape_key(k) for k in choice.shapes)
    return (choice.backend, choice.device, choice.precision, choice.streams, packed) == (
        plan.backend.name,
        plan.device.name,
        plan.precision,
        plan.streams,
        default_packed,
    )


def default_choice(plan: TowerPlan, like: TowerChoice) -> TowerChoice:
    """The defaults' configuration of a tower, as a tuning file records it (the shapes of `like`)."""
    shapes = {k: ShapeChoice(prepack=(not plan.share) or parse_shape_key(k) in plan.prepack) for k in like.shapes}
    return TowerChoice(
        backend=plan.backend.name,
        device=plan.device.name,
        precision=plan.precision,  # type: ignore[arg-type]
        streams=plan.streams,
        threads_per_stream=plan.threads_per_stream,
        shapes=shapes,
    )


async def _rates(
    settings: RuntimeSettings, manifest: ModelManifest, towers: Sequence[str], seconds: float, into: Rates
) -> dict[str, TowerPlan]:
    encoder = LocalEncoder(settings, manifest)
    await encoder.start()
    texts, images = text_payloads(), image_payloads()
    try:
        for tower in towers:
            await measure(encoder, tower, 1, 0.0, texts, images, min_requests=2)  # settle threads and arenas
            for concurrency in CONCURRENCIES:
                items, took, _ = await measure(encoder, tower, concurrency, seconds, texts, images)
                into.setdefault((tower, concurrency), []).append(items / took)
        return dict(encoder.plans)
    finally:
        await encoder.close()
        del encoder
        gc.collect()
        trim_heap()


def validate(
    model_dir: Path,
    manifest: ModelManifest,
    tuning: TuningFile,
    seconds: float,
    progress: Callable[[str, int, int], None],
) -> tuple[TuningFile, list[ValidationPoint], list[str]]:
    """The tuning with each tower that is not faster than the defaults set to them; the points
    measured; the towers set to the defaults."""
    with tempfile.TemporaryDirectory(prefix="cnclip-tune-") as folder:
        tuned_path = write_tuning(Path(folder) / "tuning.json", tuning)
        common = {"model_dir": model_dir, "query_cache_size": 0}  # repeated payloads must reach the model
        tuned = RuntimeSettings(**common, tuning_file=tuned_path)  # type: ignore[arg-type]
        default = RuntimeSettings(**common, tuning_file=Path(folder) / "absent.json")  # type: ignore[arg-type]
        return asyncio.run(_validate(tuned, default, manifest, tuning, seconds, progress))


async def _validate(
    tuned: RuntimeSettings,
    default: RuntimeSettings,
    manifest: ModelManifest,
    tuning: TuningFile,
    seconds: float,
    progress: Callable[[str, int, int], None],
) -> tuple[TuningFile, list[ValidationPoint], list[str]]:
    progress("validating: the defaults", 0, 2 * PASSES)
    default_rates: Rates = {}
    tuned_rates: Rates = {}
    plans = await _rates(default, manifest, [], 0.0, default_rates)  # the defaults' plans: what differs?
    towers = [t for t, choice in tuning.towers.items() if not same_as_default(choice, plans[t])]
    if not towers:
        return tuning, [], []
    for pass_ in range(PASSES):
        order = [(default, default_rates), (tuned, tuned_rates)]
        for step, (settings, into) in enumerate(order if pass_ % 2 == 0 else order[::-1]):
            which = "the choice" if settings is tuned else "the defaults"
            progress(f"validating ({pass_ + 1}/{PASSES}): {which}", 2 * pass_ + step, 2 * PASSES)
            await _rates(settings, manifest, towers, seconds, into)
    points = [
        ValidationPoint(
            tower=tower,  # type: ignore[arg-type]
            concurrency=c,
            tuned_items_s=round(statistics.median(tuned_rates[tower, c]), 2),
            default_items_s=round(statistics.median(default_rates[tower, c]), 2),
        )
        for tower in towers
        for c in CONCURRENCIES
    ]
    kept_defaults: list[str] = [t for t in towers if not _faster([p for p in points if p.tower == t])]
    choices = dict(tuning.towers)
    for tower in kept_defaults:
        choices[tower] = default_choice(plans[tower], choices[tower])  # type: ignore[index]
    return tuning.model_copy(update={"towers": choices}), points, kept_defaults


def _faster(points: list[ValidationPoint]) -> bool:
    ratios = [p.tuned_items_s / p.default_items_s if p.default_items_s > 0 else 1.0 for p in points]
    geomean = math.exp(sum(math.log(max(r, 1e-9)) for r in ratios) / len(ratios))
    return geomean > 1.0 and min(ratios) >= LOSS_TOLERANCE
