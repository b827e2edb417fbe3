"""Before the tuning file is written: the choice against the defaults, as `serve` runs them.

The per-shape measurements time sessions alone; a search service runs them beside each other, behind
the dynamic batcher and the HTTP stack, with preprocessing on the same cores — where a choice that won
alone can lose (prepacked b8 text beside b1 doubled p50 at concurrency 8 on an AMX Xeon, issue 24). So
each configuration runs as a `cnclip worker` of its own (retrieval/toolchain/tune/served.py: the
encoder, batcher, preprocessing and HTTP stack `serve` answers with), one with the tuning file and one
without, driven over HTTP by closed-loop clients at concurrency 1 and 8. One worker at a time (the
memory bound of the tuner: this process has closed every session it measured), in `PASSES` passes of
alternating order (default, tuned; tuned, default); items/s is the median over the passes.

A tower keeps its choice when it is faster — the geometric mean of its items/s ratios (tuned ÷
default) over the two concurrencies above 1.0 — and loses by no more than `LOSS_TOLERANCE` at either;
otherwise the tower runs the defaults, recorded as such in the file.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from retrieval.config import RuntimeSettings
from retrieval.encoder import LocalEncoder
from retrieval.errors import ModelError
from retrieval.manifest import ModelManifest
from retrieval.toolchain.tune.served import running_worker, served_rate, tower_load
from retrieval.tower_plan import TowerPlan
from retrieval.tuning import ShapeChoice, TowerChoice, TuningFile, ValidationPoint, parse_shape_key, write_tuning

CONCURRENCIES = (1, 8)
PASSES = 2
SETTLE_S = 0.2  # the first requests of each tower, not counted
LOSS_TOLERANCE = 0.95  # a choice slower than this × the default at either concurrency is not kept

Rates = dict[tuple[str, int], list[float]]  # (tower, concurrency) -> items/s per pass


def same_as_default(choice: TowerChoice, plan: TowerPlan) -> bool:
    """The choice opens what the defaults open (then there is nothing to compare)."""
    if (choice.backend, choice.device, choice.precision, choice.streams) != (
        plan.backend.name,
        plan.device.name,
        plan.precision,
        plan.streams,
    ):
        return False
    # The same backend, device and settings: the choice runs one shape-dynamic session where the defaults do.
    packed = frozenset(parse_shape_key(k) for k, v in choice.shapes.items() if v.prepack)
    if plan.dynamic:
        return choice.one_session() and packed == plan.prepack
    return packed == (plan.prepack if plan.share else frozenset(parse_shape_key(k) for k in choice.shapes))


def default_choice(plan: TowerPlan, like: TowerChoice) -> TowerChoice:
    """The defaults' configuration of a tower, as a tuning file records it (the shapes of `like`)."""
    # Every shape has its own copy where nothing is shared; else the tuned ones (beside the one session too).
    own_everywhere = not plan.share and not plan.dynamic
    shapes = {k: ShapeChoice(prepack=own_everywhere or parse_shape_key(k) in plan.prepack) for k in like.shapes}
    return TowerChoice(
        backend=plan.backend.name,
        device=plan.device.name,
        precision=plan.precision,  # type: ignore[arg-type]
        streams=plan.streams,
        threads_per_stream=plan.threads_per_stream,
        shapes=shapes,
        dynamic=plan.dynamic if plan.backend.dynamic_sessions(plan.device.name) else None,
    )


def _default_plans(settings: RuntimeSettings, manifest: ModelManifest) -> dict[str, TowerPlan]:
    """The plans the defaults make here (what differs from the choice?); no session is opened."""
    encoder = LocalEncoder(settings, manifest)
    encoder._plan()  # noqa: SLF001 - what start() does before it opens sessions (as retrieval/model_check.py)
    return dict(encoder.plans)


def _served_rates(
    model_dir: Path, tuning_file: Path, context_length: int, towers: Sequence[str], seconds: float, into: Rates
) -> float:
    """One worker's items/s per (tower, concurrency) into `into`; its peak memory in MB."""
    with running_worker(model_dir, tuning_file) as worker:
        tuned, sources = tuning_file.is_file(), worker.plan_sources()
        for tower in towers:  # a worker that ignored the file would compare the defaults with themselves
            if (sources.get(tower) == "tuning file") != tuned:
                raise ModelError(
                    f"the validation worker {'with' if tuned else 'without'} the tuning file planned its {tower} "
                    f"tower from {sources.get(tower) or 'nothing it logged'} (CNCLIP_BACKEND or CNCLIP_PRECISION "
                    "set? they override the file, in serve too)"
                )
        for tower in towers:
            load = tower_load(worker.port, tower, context_length)
            served_rate(worker, load, 1, SETTLE_S)  # the first requests of a tower settle its threads and arenas
            for concurrency in CONCURRENCIES:
                into.setdefault((tower, concurrency), []).append(served_rate(worker, load, concurrency, seconds))
        return worker.peak_rss_mb()


def validate(
    model_dir: Path,
    manifest: ModelManifest,
    tuning: TuningFile,
    seconds: float,
    progress: Callable[[str, int, int], None],
) -> tuple[TuningFile, list[ValidationPoint], list[str], float]:
    """The tuning with each tower that is not faster than the defaults set to them; the points
    measured; the towers set to the defaults; the workers' peak memory in MB (0.0: none ran)."""
    progress("validating: the defaults", 0, 2 * PASSES)
    default_rates: Rates = {}
    tuned_rates: Rates = {}
    peak = 0.0
    with tempfile.TemporaryDirectory(prefix="cnclip-tune-") as folder:
        absent = Path(folder) / "absent.json"  # no tuning file: the defaults
        plans = _default_plans(RuntimeSettings(model_dir=model_dir, tuning_file=absent), manifest)
        towers = [t for t, choice in tuning.towers.items() if not same_as_default(choice, plans[t])]
        if not towers:
            return tuning, [], [], 0.0
        tuned_path = write_tuning(Path(folder) / "tuning.json", tuning)
        for pass_ in range(PASSES):
            order = [(absent, default_rates), (tuned_path, tuned_rates)]
            for step, (path, into) in enumerate(order if pass_ % 2 == 0 else order[::-1]):
                which = "the choice" if path == tuned_path else "the defaults"
                progress(f"validating over HTTP ({pass_ + 1}/{PASSES}): {which}", 2 * pass_ + step, 2 * PASSES)
                used = _served_rates(model_dir, path, manifest.context_length, towers, seconds, into)
                peak = max(peak, used)
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
    return tuning.model_copy(update={"towers": choices}), points, kept_defaults, peak


def _faster(points: list[ValidationPoint]) -> bool:
    ratios = [p.tuned_items_s / p.default_items_s if p.default_items_s > 0 else 1.0 for p in points]
    geomean = math.exp(sum(math.log(max(r, 1e-9)) for r in ratios) / len(ratios))
    return geomean > 1.0 and min(ratios) >= LOSS_TOLERANCE
