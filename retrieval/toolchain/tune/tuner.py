"""`cnclip tune`: measure this machine, choose per tower, write the tuning file.

1. **Candidates**: every backend of the registry that is usable here × every run precision it
   offers for the tower's graphs (ONNX Runtime: int8/fp32…; OpenVINO: int8 (NNCF), fp32, bf16 where
   the CPU computes it).
2. **Gate**: each candidate against the fp32 graphs on the parity set (retrieval/toolchain/gate.py), on this
   machine; what fails is refused and not measured.
3. **Measure**: per tower and shape (batch bucket × text length), each candidate with one shared
   weight copy and with its own prepacked copy (where the backend can share at all), one stream on
   all cores, in interleaved rounds (every configuration once per round, so a slow minute hits
   all alike); the median of the rounds, with min/max.
4. **Choose**: per tower one backend and precision (so a vector never depends on the batch it ran
   in), the one whose per-shape times are closest to each shape's fastest (geometric mean of the
   ratios); per shape prepacked where that is at least `PREPACK_GAIN` faster (for `latency` at
   batch 1 only: see `shape_choices`), within the memory budget (retrieval/toolchain/tune/memory.py: the
   least gain dropped first). Streams: 1 (latency, a search service) unless
   `--objective throughput`, which measures N streams × 1 thread against 1 × N.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from retrieval.backends import BACKENDS, SessionConfig, backend_named
from retrieval.backends.onnxruntime import ONNXRUNTIME
from retrieval.errors import InvalidInput, ModelError
from retrieval.manifest import ModelManifest
from retrieval.memory import return_large_frees_to_os
from retrieval.memory_budget import BudgetSetting, resolve_budget
from retrieval.recorded_gate import recorded_failures
from retrieval.sessions import dummy_batch
from retrieval.shared_weights import SharedWeights
from retrieval.toolchain.gate import Candidate, GateResult, run_gate, tower_shapes
from retrieval.toolchain.tune.memory import TowerMemory, fit_prepacks, fit_towers, rss_mb
from retrieval.tower_plan import weight_bytes
from retrieval.tuning import (
    Fingerprint,
    Measurement,
    Shape,
    ShapeChoice,
    TowerChoice,
    TuningFile,
    machine_fingerprint,
    now_utc,
    shape_key,
)
from retrieval.types import TOWERS

PREPACK_GAIN = 1.05  # a prepacked copy is kept only when it is at least this much faster
Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class Config:
    """One configuration measured: a candidate and how its sessions hold weights."""

    candidate: Candidate
    weights: str  # "shared" | "prepacked" | "own"

    @property
    def label(self) -> str:
        return f"{self.candidate.label} {self.weights}"


@dataclass
class TuneOptions:
    rounds: int = 3
    seconds: float = 0.5  # per configuration, shape and round
    time_limit: float = 900.0  # seconds for the measurements; rounds stop early past it
    backends: Sequence[str] = ()  # empty: every usable backend
    objective: str = "latency"
    memory_budget_mb: BudgetSetting = "auto"
    buckets: Sequence[int] = ()  # empty: every bucket the model has
    cores: list[int] = field(default_factory=lambda: sorted(os.sched_getaffinity(0)))


@dataclass
class TuneResult:
    tuning: TuningFile
    gate: list[GateResult]
    skipped: list[str]  # backends not usable here, with the reason
    samples: dict[tuple[str, Shape, str], list[float]]  # (tower, shape, config label) -> ms per round


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
    return _shapes(manifest, tower, candidate.graph, buckets)


def _shapes(manifest: ModelManifest, tower: str, graph: str, buckets: Sequence[int]) -> list[Shape]:
    shapes = tower_shapes(manifest, tower, graph)
    return [s for s in shapes if not buckets or s[0] in buckets]


def open_config(manifest: ModelManifest, tower: str, config: Config, shapes: Sequence[Shape], cores: list[int]):  # type: ignore[no-untyped-def]
    """One session per shape for a configuration (shared weights: one `SharedWeights` for all)."""
    c = config.candidate
    weights = SharedWeights(f"{tower}/{c.graph}") if config.weights == "shared" else None
    session_config = SessionConfig(
        provider=c.device,
        precision=c.graph,
        cores=cores,
        weights=weights,
        backend=c.backend.name,
        run_precision=c.precision,
    )
    spec = manifest.towers[tower]
    sessions = {}
    for bucket, length in shapes:
        path = manifest.graph_path(tower, c.graph, bucket, length)
        sessions[bucket, length] = c.backend.open_session(path, session_config, spec.input_name, spec.output_name)
    return sessions


def time_calls(run: Callable[[], object], seconds: float) -> float:
    """Median ms of one call, calling back to back for about `seconds` (at least 2 calls after one warm-up)."""
    run()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 2:
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def measure(
    manifest: ModelManifest,
    passed: dict[str, list[Candidate]],
    options: TuneOptions,
    progress: Progress,
) -> tuple[dict[tuple[str, Shape, str], list[float]], dict[tuple[str, str], float]]:
    """Interleaved rounds over every tower, configuration and shape: ms per round; and the MB each
    configuration's sessions took (resident growth while they opened and ran once, all kept open)."""
    plan: list[tuple[str, Config, Shape]] = []
    opened = {}
    memory: dict[tuple[str, str], float] = {}
    for tower, options_ in passed.items():
        for candidate in options_:
            modes = ["shared", "prepacked"] if _least_mode(candidate) == "shared" else ["own"]
            for mode in modes:
                config = Config(candidate, mode)
                shapes = _shapes(manifest, tower, candidate.graph, options.buckets)
                progress(f"opening {tower} {config.label}", 0, 1)
                gc.collect()  # earlier garbage freed now, not while this configuration is being charged
                before = rss_mb()
                opened[tower, config.label] = open_config(manifest, tower, config, shapes, options.cores)
                for (bucket, length), session in opened[tower, config.label].items():
                    session.run(dummy_batch(tower, bucket, manifest.image_size, length or manifest.context_length))
                memory[tower, config.label] = max(0.0, rss_mb() - before)
                plan += [(tower, config, s) for s in shapes]
    samples: dict[tuple[str, Shape, str], list[float]] = {}
    per_case = min(options.seconds, options.time_limit / max(1, len(plan) * options.rounds) / 2)
    started, total = time.monotonic(), len(plan) * options.rounds
    for round_ in range(options.rounds):
        if round_ and time.monotonic() - started > options.time_limit:
            break  # the time limit: the rounds done so far are the measurement
        order = plan[round_ % max(1, len(plan)) :] + plan[: round_ % max(1, len(plan))]  # rotate the start
        for done, (tower, config, shape) in enumerate(order):
            session = opened[tower, config.label][shape]
            batch = dummy_batch(tower, shape[0], manifest.image_size, shape[1] or manifest.context_length)
            progress(
                f"round {round_ + 1}/{options.rounds}: {tower} {shape_key(shape)} {config.label}",
                round_ * len(plan) + done,
                total,
            )
            samples.setdefault((tower, shape, config.label), []).append(
                time_calls(partial(session.run, batch), per_case)
            )
    progress("measured", total, total)
    return samples, memory


def _median(values: list[float]) -> float:
    return statistics.median(values)


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
        ratios = [_best_ms(samples, tower, c, s) / fastest[s] for s in shapes_of(c)]
        return math.exp(sum(math.log(r) for r in ratios) / len(ratios))

    # Ties keep the backend's order of preference (sorted is stable).
    return sorted(((score(c), c) for c in measured), key=lambda sc: sc[0])


def _best_ms(samples: dict[tuple[str, Shape, str], list[float]], tower: str, c: Candidate, shape: Shape) -> float:
    times = [_median(v) for m in ("shared", "prepacked", "own") if (v := samples.get((tower, shape, f"{c.label} {m}")))]
    return min(times) if times else math.inf


def shape_choices(
    tower: str,
    winner: Candidate,
    samples: dict[tuple[str, Shape, str], list[float]],
    shapes: list[Shape],
    objective: str = "latency",
) -> dict[Shape, ShapeChoice]:
    """Per shape of the chosen candidate: prepacked where that is at least PREPACK_GAIN faster — for
    `latency` at batch 1 only. Batched shapes of a search service run when queries arrive together,
    beside the batch-1 sessions, and there a prepacked b8 text session cost what it saved alone: on
    the AMX Xeon, text at concurrency 8 over HTTP had p50 53 ms with b1, b1.l16 and b8.l16 prepacked,
    22.5 ms with b1 and b1.l16 only (26 ms shipped), though b8.l16 alone ran 17.5 against 22.1 ms
    (BENCHMARKS.md, issue 24). `throughput` (bulk indexing) prepacks every shape that gains."""
    out: dict[Shape, ShapeChoice] = {}
    for s in shapes:
        shared = samples.get((tower, s, f"{winner.label} shared"))
        packed = samples.get((tower, s, f"{winner.label} prepacked"))
        if shared and packed:
            gain = _median(shared) / _median(packed)
            keep = gain >= PREPACK_GAIN and (objective == "throughput" or s[0] == 1)
            out[s] = ShapeChoice(
                prepack=keep, ms=round(min(_median(shared), _median(packed)), 3), prepack_gain=round(gain, 3)
            )
        else:
            out[s] = ShapeChoice(prepack=False, ms=round(_best_ms(samples, tower, winner, s), 3))
    return out


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


def run_tune(model_dir: Path, options: TuneOptions, progress: Progress = lambda *_: None) -> TuneResult:
    """Gate, measure and choose (see the module docstring); the caller writes the file."""
    manifest = ModelManifest.load(model_dir)
    if options.objective not in ("latency", "throughput"):
        raise InvalidInput("--objective must be latency or throughput")
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
    samples, memory = measure(manifest, passed, options, progress)
    shapes_of = {t: partial(_candidate_shapes, manifest, t, options.buckets) for t in TOWERS}
    ranked = {t: rank_tower(t, passed[t], samples, shapes_of[t]) for t in TOWERS}

    def least_mb(tower: str, c: Candidate) -> float:
        return memory[tower, f"{c.label} {_least_mode(c)}"]

    weights_mb = sum(weight_bytes(manifest, t, r[0][1].graph, r[0][1].precision) for t, r in ranked.items()) / 2**20
    budget = resolve_budget(options.memory_budget_mb, weights_mb)
    picked, notes = fit_towers(ranked, least_mb, budget)
    skipped.extend(notes)
    winners = {t: (c, shape_choices(t, c, samples, shapes_of[t](c), options.objective)) for t, c in picked.items()}
    choices: dict[str, TowerChoice] = {}
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
        )
    choices = fit_prepacks(
        choices, {t: _tower_memory(t, c, memory, len(shapes_of[t](c))) for t, c in picked.items()}, budget
    )
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
    )
    return TuneResult(tuning, gate, skipped, samples)


def _least_mode(c: Candidate) -> str:
    """How a candidate's sessions hold the fewest weight copies: one shared, or each its own."""
    return "shared" if c.backend.shares_weights(c.device) else "own"


def _tower_memory(tower: str, c: Candidate, memory: dict[tuple[str, str], float], shapes: int) -> TowerMemory:
    if _least_mode(c) == "own":
        return TowerMemory(False, 0.0, memory[tower, f"{c.label} own"] / max(shapes, 1))
    prepacked = memory.get((tower, f"{c.label} prepacked"), 0.0)
    return TowerMemory(True, memory[tower, f"{c.label} shared"], prepacked / max(shapes, 1))


def _measurements(
    samples: dict[tuple[str, Shape, str], list[float]], found: dict[str, list[Candidate]]
) -> list[Measurement]:
    by_label = {f"{c.label} {m}": (c, m) for cs in found.values() for c in cs for m in ("shared", "prepacked", "own")}
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
                ms=round(_median(values), 3),
                ms_min=round(min(values), 3),
                ms_max=round(max(values), 3),
            )
        )
    return out
