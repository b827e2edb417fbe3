"""The tuner's measurement: one configuration open at a time, in passes of alternating order.

Holding every backend × precision × shape session open at once took `cnclip tune` to 22.4 GB on a
24 GB machine for ViT-B-16 (issue 34). Here a configuration's sessions are opened, warmed, measured
(every shape, `sample_calls`) and closed — dropped, collected, the heap trimmed back to the system —
before the next opens, so the peak is the base plus the largest configuration.

Fairness without everything open: re-opening per call (a round-robin over configurations) would
cost an engine compile per sample, so each configuration's shapes are measured as a block, and the
blocks are repeated over `passes` (≥ 2) whose order alternates — rotated by the pass and reversed on
odd passes — so a slow minute falls on different configurations in each pass, and the choice reads
each configuration's fastest pass (retrieval/toolchain/tune/ranking.py: a pass opens it afresh, and
what differs between passes only slows one down). A case whose pass medians disagree by more than twice
the call spread bound counts as noisy, like a case whose calls did (retrieval/toolchain/tune/noise.py).

A case runs the input `serve` would give its session (`case_batch`): a text on the one shape-dynamic
session at its served width (retrieval/text_lengths.py), on a static session padded to the bucket.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from retrieval.backends import SessionConfig
from retrieval.manifest import ModelManifest
from retrieval.memory import trim_heap
from retrieval.memory_budget import BudgetSetting
from retrieval.sessions import dummy_batch
from retrieval.shared_weights import SharedWeights
from retrieval.text_lengths import served_width
from retrieval.toolchain.gate import Candidate, tower_shapes
from retrieval.toolchain.tune.memory import peak_rss_mb, reset_peak_rss, rss_mb
from retrieval.toolchain.tune.noise import SPREAD_BOUND, CpuWatch, sample_calls
from retrieval.tuning import Shape, shape_key

Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class Config:
    """One configuration measured: a candidate and how its sessions hold weights."""

    candidate: Candidate
    weights: str  # "shared" | "prepacked" | "own" | "dynamic" (one shape-dynamic session, its own copy)

    @property
    def label(self) -> str:
        return f"{self.candidate.label} {self.weights}"


@dataclass
class TuneOptions:
    rounds: int = 2  # passes over every configuration (≥ 2 to see a slow minute)
    seconds: float = 0.5  # per configuration, shape and pass (more while the calls vary)
    time_limit: float = 900.0  # seconds for the measurements; passes past the second stop early past it
    backends: Sequence[str] = ()  # empty: every usable backend
    objective: str = "latency"
    memory_budget_mb: BudgetSetting = "auto"
    buckets: Sequence[int] = ()  # empty: every bucket the model has
    cores: list[int] = field(default_factory=lambda: sorted(os.sched_getaffinity(0)))
    validate_seconds: float = 2.0  # per tower, concurrency, configuration and pass; 0: no validation
    accept_noise: bool = False  # write the file trusted even when other work competed (warned all the same)


@dataclass
class Measured:
    """What one measurement found."""

    samples: dict[tuple[str, Shape, str], list[float]]  # (tower, shape, config label) -> median ms per pass
    memory: dict[tuple[str, str], float]  # (tower, config label) -> MB its sessions took
    noisy: set[tuple[str, Shape, str]] = field(default_factory=set)
    other_cores: float = 0.0  # other processes' CPU on our cores meanwhile
    # Resident between configurations (all closed), at its highest: the engines keep some state
    # after their first compile (OpenVINO ~30 MB), so this is the base the largest one stands on.
    base_mb: float = 0.0
    # (tower, config label) -> MB over the resident memory before it opened at its highest, while it
    # opened and ran (engines allocate more while compiling than they keep): the bound of the peak.
    peaks: dict[tuple[str, str], float] = field(default_factory=dict)
    peak_mb: float = 0.0  # the highest resident memory while measuring

    @property
    def largest_mb(self) -> float:
        return max(self.peaks.values(), default=0.0)


def shapes_of(manifest: ModelManifest, tower: str, graph: str, buckets: Sequence[int]) -> list[Shape]:
    return [s for s in tower_shapes(manifest, tower, graph) if not buckets or s[0] in buckets]


def open_config(manifest: ModelManifest, tower: str, config: Config, shapes: Sequence[Shape], cores: list[int]):  # type: ignore[no-untyped-def]
    """One session per shape for a configuration (shared weights: one `SharedWeights` for all;
    dynamic: every shape on the one shape-dynamic session the backend opens at the first run)."""
    c = config.candidate
    weights = SharedWeights(f"{tower}/{c.graph}") if config.weights == "shared" else None
    session_config = SessionConfig(
        provider=c.device,
        precision=c.graph,
        cores=cores,
        weights=weights,
        backend=c.backend.name,
        run_precision=c.precision,
        dynamic_shapes=config.weights == "dynamic",
    )
    spec = manifest.towers[tower]
    sessions = {}
    for bucket, length in shapes:
        path = manifest.graph_path(tower, c.graph, bucket, length)
        sessions[bucket, length] = c.backend.open_session(path, session_config, spec.input_name, spec.output_name)
    return sessions


def time_calls(run: Callable[[], object], seconds: float) -> float:
    """Median ms of one call (`sample_calls`: at least a few calls, more while they vary)."""
    return sample_calls(run, seconds).ms


def least_mode(c: Candidate) -> str:
    """How a candidate's sessions hold the fewest weight copies: one shared, or each its own."""
    return "shared" if c.backend.shares_weights(c.device) else "own"


def modes(c: Candidate) -> list[str]:
    """How the tuner measures a candidate's sessions: on one shared copy and each prepacked where the
    backend can share (and on one shape-dynamic session where it can run one: what `serve` runs by
    default on ONNX Runtime's CPU, so a choice is never measured against less than the defaults)."""
    if least_mode(c) != "shared":
        return ["own"]
    return ["shared", "prepacked"] + (["dynamic"] if c.backend.dynamic_sessions(c.device) else [])


def _free() -> None:
    gc.collect()
    trim_heap()


@contextmanager
def _collect_only_new_objects() -> Iterator[None]:
    """While measuring, `_free()`'s collection walks only the objects made since it began: what the
    closed sessions left is among them, and a caller's own heap (a test run, a notebook) is not walked
    again per configuration — in a process of a few million objects each walk took ~1 s, more than the
    toy model's whole measurement. A heap someone else froze is theirs to thaw: left as it is."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def measure(
    manifest: ModelManifest,
    passed: dict[str, list[Candidate]],
    options: TuneOptions,
    progress: Progress,
) -> Measured:
    """Every configuration of every tower, one open at a time, over `options.rounds` passes."""
    blocks: list[tuple[str, Config, list[Shape]]] = []
    for tower, candidates_ in passed.items():
        for candidate in candidates_:
            shapes = shapes_of(manifest, tower, candidate.graph, options.buckets)
            blocks += [(tower, Config(candidate, mode), shapes) for mode in modes(candidate)]
    passes = max(1, options.rounds)
    cases = sum(len(shapes) for _, _, shapes in blocks)
    per_case = min(options.seconds, options.time_limit / max(1, cases * passes) / 2)
    found = Measured({}, {})
    _free()
    watch = CpuWatch(options.cores)
    watch.start()
    started, done = time.monotonic(), 0
    with _collect_only_new_objects():
        for pass_ in range(passes):
            if pass_ >= 2 and time.monotonic() - started > options.time_limit:
                break  # the time limit: two passes always, more while time is left
            order = blocks[pass_ % len(blocks) :] + blocks[: pass_ % len(blocks)] if blocks else []
            for tower, config, shapes in order if pass_ % 2 == 0 else reversed(order):
                progress(f"pass {pass_ + 1}/{passes}: {tower} {config.label}", done, cases * passes)
                _free()  # earlier garbage freed now, not while this configuration is being charged
                _measure_block(manifest, tower, config, shapes, options.cores, per_case, found)
                _free()  # its sessions are closed: the next configuration opens into the freed memory
                done += len(shapes)
    found.other_cores = watch.stop()
    for case, medians in found.samples.items():
        middle = statistics.median(medians)
        if len(medians) > 1 and middle > 0 and (max(medians) - min(medians)) / middle > 2 * SPREAD_BOUND:
            found.noisy.add(case)
    progress("measured", cases * passes, cases * passes)
    return found


def _measure_block(
    manifest: ModelManifest,
    tower: str,
    config: Config,
    shapes: list[Shape],
    cores: list[int],
    per_case: float,
    found: Measured,
) -> None:
    """Open one configuration's sessions, charge their memory, time every shape; the sessions close
    when this returns (nothing else holds them)."""
    reset_peak_rss()
    before = rss_mb()
    found.base_mb = max(found.base_mb, before)
    sessions = open_config(manifest, tower, config, shapes, cores)
    lengths = sorted({n or manifest.context_length for _, n in shapes})
    batches = {s: case_batch(manifest, tower, s, session, lengths) for s, session in sessions.items()}
    for shape, session in sessions.items():
        session.run(batches[shape])  # warm: the first run allocates what later runs reuse
    key = (tower, config.label)
    found.memory[key] = max(found.memory.get(key, 0.0), rss_mb() - before, 0.0)
    for shape, session in sessions.items():
        stats = sample_calls(partial(session.run, batches[shape]), per_case)
        case = (tower, shape, config.label)
        found.samples.setdefault(case, []).append(stats.ms)
        if stats.noisy:
            found.noisy.add(case)
    peak = peak_rss_mb()
    found.peaks[key] = max(found.peaks.get(key, 0.0), peak - before)
    found.peak_mb = max(found.peak_mb, peak)


def case_batch(
    manifest: ModelManifest, tower: str, shape: Shape, session: object, lengths: Sequence[int]
) -> np.ndarray:
    """A case's input as `serve` runs it: a text on a session that runs any width up to the longest
    length (the one shape-dynamic session: the encoder's `tight_text`, retrieval/encoder.py) cut to
    the bucket's served width, as the encoder cuts a batch to its longest row; on any other session
    padded to the bucket's length."""
    bucket, length = shape[0], shape[1] or manifest.context_length
    batch = dummy_batch(tower, bucket, manifest.image_size, length)
    any_length = int(getattr(session, "any_length_up_to", lambda: 0)()) if tower == "text" else 0
    if any_length >= lengths[-1]:
        return np.ascontiguousarray(batch[:, : served_width(length, lengths)])
    return batch


def describe(case: tuple[str, Shape, str]) -> str:
    tower, shape, label = case
    return f"{tower} {shape_key(shape)} {label}"
