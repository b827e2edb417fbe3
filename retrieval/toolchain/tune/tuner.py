"""`cnclip tune`: measure this machine, choose per tower, write the tuning file.

1. **Candidates**: every backend of the registry that is usable here × every run precision it
   offers for the tower's graphs (ONNX Runtime: int8/fp32…; OpenVINO: int8 (NNCF), fp32, bf16 where
   the CPU computes it).
2. **Gate**: each candidate against the fp32 graphs on the parity set (retrieval/toolchain/gate.py), on this
   machine; what fails is refused and not measured.
3. **Measure** (retrieval/toolchain/tune/measure.py): per tower and shape (batch bucket × text
   length), each candidate with one shared weight copy and with its own prepacked copy (where the
   backend can share at all), one stream on all cores; one configuration open at a time, in passes
   of alternating order; calls per case until their spread settles (retrieval/toolchain/tune/noise.py).
   When other work competes for the cores or the cases stay noisy: one warning, measured again
   once, and if still so the file is written marked untrusted (`serve` ignores it).
4. **Choose**: per tower one backend and precision (so a vector never depends on the batch it ran
   in), the one whose per-shape times are closest to each shape's fastest (geometric mean of the
   ratios); per shape prepacked where that gains enough (`shape_choices`), within the memory budget
   (retrieval/toolchain/tune/memory.py: the least gain dropped first). Streams: 1 (latency, a search
   service) unless `--objective throughput`, which measures N streams × 1 thread against 1 × N.
5. **Validate** (retrieval/toolchain/tune/validate.py): the choice against the defaults as `serve`
   runs them (a `cnclip worker` each, over HTTP, concurrency 1 and 8, interleaved); a tower whose
   choice is not faster keeps the defaults. The report (peak memory, duration, load, validation) goes in the file.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from retrieval.backends import BACKENDS, backend_named
from retrieval.backends.onnxruntime import ONNXRUNTIME
from retrieval.errors import InvalidInput, ModelError
from retrieval.manifest import ModelManifest
from retrieval.memory import return_large_frees_to_os
from retrieval.memory_budget import Budget, resolve_budget
from retrieval.recorded_gate import recorded_failures
from retrieval.sessions import dummy_batch
from retrieval.toolchain.gate import Candidate, GateResult, run_gate
from retrieval.toolchain.tune.measure import (
    Config,
    Measured,
    Progress,
    TuneOptions,
    describe,
    least_mode,
    measure,
    modes,
    open_config,
    shapes_of,
)
from retrieval.toolchain.tune.memory import TowerMemory, fit_prepacks, fit_towers, peak_rss_mb, reset_peak_rss
from retrieval.toolchain.tune.noise import load_average, noise_reason, others_competed, others_now
from retrieval.toolchain.tune.ranking import MODES, one_session, rank_tower, shape_choices
from retrieval.toolchain.tune.served import MAX_WINDOW_S
from retrieval.toolchain.tune.validate import validate
from retrieval.tower_plan import weight_bytes
from retrieval.tuning import (
    Fingerprint,
    Measurement,
    Shape,
    TowerChoice,
    TuneReport,
    TuningFile,
    ValidationPoint,
    machine_fingerprint,
    now_utc,
    shape_key,
)
from retrieval.types import TOWERS

__all__ = ["TuneOptions", "TuneResult", "candidates", "measure", "run_tune"]


@dataclass
class TuneResult:
    tuning: TuningFile
    gate: list[GateResult]
    skipped: list[str]  # backends not usable here, with the reason
    samples: dict[tuple[str, Shape, str], list[float]]  # (tower, shape, config label) -> ms per pass
    warnings: list[str] = field(default_factory=list)


def candidates(manifest: ModelManifest, names: Sequence[str]) -> tuple[dict[str, list[Candidate]], list[str]]:
    """Every usable backend × offered run precision per tower; the reasons for the backends left out."""
    chosen = [backend_named(n) for n in names] if names else list(BACKENDS)
    found: dict[str, list[Candidate]] = {t: [] for t in TOWERS}
    skipped = []
    failed = recorded_failures(manifest.extra)
    for backend in chosen:
        detection = backend.detect()
        if not detection.found:
            skipped.append(f"{backend.name}: {detection.reason}")
            continue
        device = backend.choose_device("auto")
        for tower in TOWERS:
            offered = backend.precisions(device.name, manifest.towers[tower].precisions())
            for precision, graph in offered.items():
                if (backend.name, precision, tower) in failed:
                    skipped.append(f"{backend.name} {precision} {tower}: refused by the manifest's gate record")
                    continue
                found[tower].append(Candidate(backend, device.name, precision, graph))
    return found, skipped


def _candidate_shapes(manifest: ModelManifest, tower: str, buckets: Sequence[int], candidate: Candidate) -> list[Shape]:
    return shapes_of(manifest, tower, candidate.graph, buckets)


def measure_streams(
    manifest: ModelManifest, tower: str, candidate: Candidate, shape: Shape, cores: list[int], seconds: float
) -> dict[int, float]:
    """Items/s of `shape` with 1 stream on all cores and with one stream per core (1 thread each)."""
    rates = {}
    for streams in sorted({1, len(cores)}):
        share = [[c] for c in cores] if streams > 1 else [cores]
        config = Config(candidate, "own")
        sessions = [open_config(manifest, tower, config, [shape], cs)[shape] for cs in share]
        batch = dummy_batch(tower, shape[0], manifest.image_size, shape[1] or manifest.context_length)
        counts = [0] * streams
        end = time.perf_counter() + seconds
        threads = [threading.Thread(target=_run_until, args=(s, batch, end, counts, i)) for i, s in enumerate(sessions)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        rates[streams] = sum(counts) * shape[0] / (time.perf_counter() - start)
    return rates


def _run_until(session: object, batch: np.ndarray, end: float, counts: list[int], index: int) -> None:
    while time.perf_counter() < end:
        session.run(batch)  # type: ignore[attr-defined]
        counts[index] += 1


def run_tune(
    model_dir: Path,
    options: TuneOptions,
    progress: Progress = lambda *_: None,
    warn: Callable[[str], None] = lambda _: None,
) -> TuneResult:
    """Gate, measure (again once if noisy), choose, validate (see the module docstring); the caller
    writes the file. `warn` gets the lines about other work competing."""
    started = time.monotonic()
    manifest = ModelManifest.load(model_dir)
    if options.objective not in ("latency", "throughput"):
        raise InvalidInput("--objective must be latency or throughput")
    if not 0 <= options.validate_seconds <= MAX_WINDOW_S:  # inf (or 1e9) would hold a window open for ever
        raise InvalidInput(f"--validate-seconds must be between 0 and {MAX_WINDOW_S:g}")
    load = load_average()  # before our own gate adds to it
    found, skipped = candidates(manifest, options.backends)
    progress("quality gate", 0, 1)
    reference = Candidate(ONNXRUNTIME, ONNXRUNTIME.host_device, "fp32", "fp32")
    gate = run_gate(manifest, found, options.cores, reference)
    ok = {(r.backend, r.precision, r.tower) for r in gate if r.passed}
    passed = {t: [c for c in cs if (c.backend.name, c.precision, t) in ok] for t, cs in found.items()}
    for tower, cs in passed.items():
        if not cs:
            raise ModelError(f"no backend and precision of the {tower} tower passed the quality gate here")
    return_large_frees_to_os()  # as `serve` does: freed run buffers are not charged as a session's memory
    gate_peak = peak_rss_mb()  # measuring resets the peak per configuration (its own bound)
    measured, reason, rounds = _measure_watched(manifest, passed, options, progress, warn, load)
    warnings = [] if reason is None else [reason]
    samples = measured.samples
    choices, budget, notes = choose(manifest, passed, measured, options)
    skipped.extend(notes)
    trusted = reason is None or options.accept_noise
    tuning = TuningFile(
        format=1,
        model_id=manifest.model_id,
        created=now_utc(),
        fingerprint=Fingerprint(**machine_fingerprint()),
        objective=options.objective,  # type: ignore[arg-type]
        memory_budget_mb=budget.mb,
        towers=choices,  # type: ignore[arg-type]
        gate=[r.to_json() for r in gate],
        measurements=_measurements(samples, found),
        trusted=trusted,
        untrusted_reason=None if trusted else reason,
    )
    chose_peak = peak_rss_mb()  # the last configuration measured, and the streams (throughput)
    chosen = tuning
    tuning, points, kept, validating_mb = _validated(model_dir, manifest, tuning, options, progress)
    report = TuneReport(
        seconds=round(time.monotonic() - started, 1),
        peak_rss_mb=round(max(gate_peak, measured.peak_mb, chose_peak, peak_rss_mb(), validating_mb), 1),
        validate_peak_rss_mb=round(validating_mb, 1),
        measurements=rounds,
        load_average=round(load, 2),
        validation=points,
        kept_defaults=kept,  # type: ignore[arg-type]
        rejected={t: chosen.towers[t] for t in kept},  # type: ignore[index]
        **_measured_report(measured),
    )
    return TuneResult(tuning.model_copy(update={"report": report}), gate, skipped, samples, warnings)


def _validated(
    model_dir: Path, manifest: ModelManifest, tuning: TuningFile, options: TuneOptions, progress: Progress
) -> tuple[TuningFile, list[ValidationPoint], list[str], float]:
    """validate.py's check of a trusted choice (an untrusted file is not used: nothing to validate)
    and the memory it took, MB: this process beside one worker at a time."""
    if not tuning.trusted or options.validate_seconds <= 0:
        return tuning, [], [], 0.0
    reset_peak_rss()  # from here: the validation's peak
    tuning, points, kept, worker_mb = validate(model_dir, manifest, tuning, options.validate_seconds, progress)
    return tuning, points, kept, (peak_rss_mb() + worker_mb if points else 0.0)


def choose(
    manifest: ModelManifest, passed: dict[str, list[Candidate]], measured: Measured, options: TuneOptions
) -> tuple[dict[str, TowerChoice], Budget, list[str]]:
    """Per tower the candidate, its prepacked shapes and streams, within the memory budget; the
    budget; notes on what gave way to it."""
    samples, memory = measured.samples, measured.memory
    shapes_of = {t: partial(_candidate_shapes, manifest, t, options.buckets) for t in TOWERS}
    ranked = {t: rank_tower(t, passed[t], samples, shapes_of[t]) for t in TOWERS}

    def least_mb(tower: str, c: Candidate) -> float:
        return memory[tower, f"{c.label} {least_mode(c)}"]

    weights_mb = sum(weight_bytes(manifest, t, r[0][1].graph, r[0][1].precision) for t, r in ranked.items()) / 2**20
    budget = resolve_budget(options.memory_budget_mb, weights_mb)
    picked, notes = fit_towers(ranked, least_mb, budget)
    winners = {t: (c, shape_choices(t, c, samples, shapes_of[t](c), options.objective)) for t, c in picked.items()}
    choices: dict[str, TowerChoice] = {}
    per_shape: dict[str, TowerChoice] = {}  # where the one session was chosen: what replaces it over budget
    for tower, (winner, shapes) in winners.items():
        streams = 1
        if options.objective == "throughput" and len(options.cores) > 1:
            largest = max(shapes, key=lambda s: (s[0], s[1] or 0))
            rates = measure_streams(manifest, tower, winner, largest, options.cores, options.seconds)
            streams = max(rates, key=lambda n: rates[n])
        choices[tower] = TowerChoice(
            backend=winner.backend.name,
            device=winner.device,
            precision=winner.precision,  # type: ignore[arg-type]
            streams=streams,
            shapes={shape_key(s): v for s, v in shapes.items()},
            dynamic=False if "dynamic" in modes(winner) else None,
        )
        if (one := one_session(tower, winner, samples, shapes)) is not None:
            per_shape[tower] = choices[tower]
            one_shapes = {shape_key(s): v for s, v in one.items()}
            choices[tower] = choices[tower].model_copy(update={"shapes": one_shapes, "dynamic": True})
    costs = {t: _tower_memory(t, c, memory, len(shapes_of[t](c))) for t, c in picked.items()}
    return fit_prepacks(choices, costs, budget, per_shape), budget, notes


def _measured_report(measured: Measured) -> dict[str, float]:
    return {
        "measure_peak_rss_mb": round(measured.peak_mb, 1),
        "base_rss_mb": round(measured.base_mb, 1),
        "largest_candidate_mb": round(measured.largest_mb, 1),
        "other_cpu_cores": round(measured.other_cores, 2),
        "noisy_cases": len(measured.noisy),
    }


def _measure_watched(
    manifest: ModelManifest,
    passed: dict[str, list[Candidate]],
    options: TuneOptions,
    progress: Progress,
    warn: Callable[[str], None],
    load: float,
) -> tuple[Measured, str | None, int]:
    """Measure with an eye on the load: when other work competed (before or meanwhile) or too many
    cases stayed noisy, warn once and measure again; the reason when the second is noisy too."""
    cores = len(options.cores)
    reason, peak = None, 0.0
    for attempt in (1, 2):
        before = others_now(options.cores)  # a second with nothing of ours running: who else is busy?
        measured = measure(manifest, passed, options, progress)
        measured.peak_mb = peak = max(peak, measured.peak_mb)
        other = max(before, measured.other_cores)
        measured.other_cores = other
        reason = noise_reason(other, len(measured.noisy), len(measured.samples), load, cores)
        if reason is None:
            return measured, None, attempt
        if attempt == 2 or options.accept_noise:  # --accept-noise: a host never quiet, again would not help
            return measured, reason, attempt
        noisy = ", ".join(describe(c) for c in sorted(measured.noisy, key=str)[:3])
        cause = "other work competes for the CPUs" if others_competed(other) else "the calls varied"
        warn(
            f"warning: {cause} ({reason}"
            + (f"; e.g. {noisy}" if noisy else "")
            + "): the times are not reliable; measuring again"
        )
    return measured, reason, 2


def _tower_memory(tower: str, c: Candidate, memory: dict[tuple[str, str], float], shapes: int) -> TowerMemory:
    if least_mode(c) == "own":
        return TowerMemory(False, 0.0, memory[tower, f"{c.label} own"] / max(shapes, 1))
    prepacked = memory.get((tower, f"{c.label} prepacked"), 0.0)
    dynamic = memory.get((tower, f"{c.label} dynamic"), 0.0)
    return TowerMemory(True, memory[tower, f"{c.label} shared"], prepacked / max(shapes, 1), dynamic)


def _measurements(
    samples: dict[tuple[str, Shape, str], list[float]], found: dict[str, list[Candidate]]
) -> list[Measurement]:
    by_label = {f"{c.label} {m}": (c, m) for cs in found.values() for c in cs for m in MODES}
    out = []
    for (tower, shape, label), values in sorted(
        samples.items(), key=lambda kv: (kv[0][0], kv[0][1][1] or 0, kv[0][1][0], kv[0][2])
    ):
        candidate, mode = by_label[label]
        out.append(
            Measurement(
                tower=tower,  # type: ignore[arg-type]
                shape=shape_key(shape),
                backend=candidate.backend.name,
                device=candidate.device,
                precision=candidate.precision,  # type: ignore[arg-type]
                weights=mode,  # type: ignore[arg-type]
                ms=round(statistics.median(values), 3),
                ms_min=round(min(values), 3),
                ms_max=round(max(values), 3),
            )
        )
    return out
