"""Fixed-shape sessions per batch bucket, grouped into streams.

A *bucketed session* is one tower's set of static graphs (one per batch bucket, e.g. 1/4/8/16/32)
opened for one stream. A *stream* owns one bucketed session per tower role and one worker thread,
so it runs one batch at a time on its own cores. A `StreamPool` hands out idle streams, the one
idle longest first, so batches spread evenly over streams.

Every backend's session (retrieval/backends/) sits behind the small `ModelSession` protocol, so
tests inject fakes and a tower's buckets may be opened by any backend.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Protocol

import numpy as np

from retrieval.backends import SessionConfig, engine_errors
from retrieval.backends.onnxruntime import OrtSession
from retrieval.errors import ModelError
from retrieval.machine_limits import CoreGate
from retrieval.manifest import ModelManifest

log = logging.getLogger(__name__)


class ModelSession(Protocol):
    """One fixed-shape graph: `run` takes exactly its batch size and returns (batch, dim) float32."""

    def run(self, batch: np.ndarray) -> np.ndarray: ...


SessionFactory = Callable[[Path, SessionConfig, str, str], ModelSession]


# A session's shape key: (batch bucket, text length bucket); None = the graph's full input length.
ShapeKey = tuple[int, int | None]


class BucketedSession:
    """One tower's graphs for one stream, keyed by batch bucket (and, for text, length bucket)."""

    def __init__(self, tower: str, sessions: dict[int, ModelSession] | dict[ShapeKey, ModelSession]) -> None:
        if not sessions:
            raise ModelError(f"{tower}: no bucket sessions")
        self.tower = tower
        keyed = {(k, None) if isinstance(k, int) else k: s for k, s in sessions.items()}
        self.sessions: dict[ShapeKey, ModelSession] = dict(
            sorted(keyed.items(), key=lambda kv: (kv[0][1] or 0, kv[0][0]))
        )
        self.shapes = list(self.sessions)
        self.buckets = sorted({bucket for bucket, _ in self.shapes})
        self.any_batch = 0  # set by `Stream.warm_up` (the sessions open at their first run)
        self.any_length = 0  # the same, for text widths

    def any_batch_up_to(self) -> int:
        """The most rows every graph here runs at any batch size from 1, unpadded (ONNX Runtime's one
        shape-dynamic session per stream, retrieval/backends/ort_batch.py); 0: bucket sizes only.

        A batch goes to the smallest bucket that holds it, so a bucket-1 session only ever runs one
        row: a static one there (a prepacked batch-1 session beside the one session, `cnclip tune`)
        does not stop the others from taking any size."""
        limits = [
            limit
            for (bucket, _), session in self.sessions.items()
            if (limit := int(getattr(session, "any_batch_up_to", lambda: 0)())) or bucket > 1
        ]
        return min(limits, default=0)

    def any_length_up_to(self) -> int:
        """The longest text every graph here runs at any width (its batch's longest row: one
        shape-dynamic session over several length buckets); 0: length buckets only."""
        limits = [int(getattr(s, "any_length_up_to", lambda: 0)()) for s in self.sessions.values()]
        return min(limits, default=0)  # 0 for images: their graphs have no length axis

    def run(self, batch: np.ndarray) -> np.ndarray:
        """Run a batch whose size is one of the buckets, or up to `any_batch_up_to()` (and, for text,
        whose width is a length bucket, or any width up to `any_length_up_to()`)."""
        rows = len(batch)
        # A size between buckets runs on the next bucket's session: where that takes any size, unpadded.
        key = next((b for b in self.buckets if b >= rows), rows) if self.any_batch else rows
        session = self.sessions.get((key, batch.shape[1])) if batch.ndim == 2 else None
        session = session or self.sessions.get((key, None))
        if session is None:
            raise ModelError(
                f"{self.tower}: batch of {rows} is not a bucket here (shape {list(batch.shape)}; graphs {self.shapes})"
            )
        return session.run(batch)

    @classmethod
    def open(
        cls,
        manifest: ModelManifest,
        tower: str,
        precision: str,
        buckets: Sequence[int],
        config: SessionConfig,
        factory: SessionFactory = OrtSession,
        lengths: Sequence[int] = (),
        prepack: Collection[ShapeKey] = (),
    ) -> BucketedSession:
        """Open every batch bucket's graph; for text also at each of `lengths` shorter than the full one.

        Shapes in `prepack` get a session with its own (prepacked) copy of the weights even when
        `config` shares one copy, or runs one shape-dynamic session: the hot buckets `cnclip tune`
        found faster that way. Beside the one session such a shape still joins it (so that session
        spans the shape's batch size and runs every size up to the largest bucket unpadded); it only
        runs its own batches elsewhere."""
        spec = manifest.towers[tower]
        shorter = [n for n in lengths if n < manifest.context_length] if tower == "text" else []
        sessions: dict[ShapeKey, ModelSession] = {}
        for length in [None, *shorter]:
            for b in buckets:
                path = manifest.graph_path(tower, precision, b, length)
                if (b, length) in prepack:
                    if config.dynamic_shapes:
                        factory(path, config, spec.input_name, spec.output_name)  # joins the one session
                    sessions[(b, length)] = factory(path, config.unshared(), spec.input_name, spec.output_name)
                else:
                    sessions[(b, length)] = factory(path, config, spec.input_name, spec.output_name)
        return cls(tower, sessions)

    def engine_precisions(self) -> list[str]:
        """What the engine reports computing in, over this tower's sessions (a fake reports nothing)."""
        return sorted({str(p) for s in self.sessions.values() if (p := getattr(s, "engine_precision", None))})


def dummy_batch(tower: str, bucket: int, image_size: int, context_length: int) -> np.ndarray:
    """A valid input of one bucket's shape: [CLS] [SEP] token rows, or grey images."""
    if tower == "text":
        ids = np.zeros((bucket, context_length), dtype=np.int64)
        ids[:, 0], ids[:, 1] = 101, 102  # cn_clip's [CLS] and [SEP]
        return ids
    return np.zeros((bucket, 3, image_size, image_size), dtype=np.float32)


_TIMING_ROUNDS = 5  # timed runs of each short bucket at warm-up; the fastest counts (a busy machine)
_RETIME_BELOW_S = 0.25  # a bucket whose run takes longer is timed once


def _timed_run(session: BucketedSession, batch: np.ndarray) -> float:
    start = time.perf_counter()
    session.run(batch)
    return time.perf_counter() - start


class Stream:
    """One inference lane: a bucketed session and the single thread that runs it.

    With a `gate` each run first holds `threads` of its permits (the session's intra-op threads):
    the process's compute threads never outnumber its cores (retrieval/machine_limits.py); an
    `urgent` stream's runs (text queries) go first in its line."""

    def __init__(
        self,
        index: int,
        session: BucketedSession,
        cores: Sequence[int] = (),
        pin: bool = False,
        gate: CoreGate | None = None,
        threads: int = 0,
        urgent: bool = False,
    ) -> None:
        self.index = index
        self.session = session
        self.cores = list(cores)
        self.gate = gate
        self.threads = threads
        self.urgent = urgent
        self.batches = 0
        self.busy_seconds = 0.0
        # Seconds of one run per batch bucket (text: at the full length), measured by `warm_up`:
        # what the batcher weighs padding against (retrieval/batcher.py `choose_batch`).
        self.bucket_seconds: dict[int, float] = {}
        initializer = self._pin_thread if pin and self.cores else None
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"{session.tower}-stream{index}", initializer=initializer
        )

    def _pin_thread(self) -> None:
        # On Linux, pid 0 means the calling thread: the thread that drives this stream's session.
        os.sched_setaffinity(0, {self.cores[0]})

    def run_timed(self, batch: np.ndarray) -> tuple[np.ndarray, float]:
        """Run in this stream's thread (call through `executor`); returns output and seconds."""
        with self._hold_cores():
            start = time.perf_counter()  # the run alone: waiting for the cores is not the graph's cost
            out = self.session.run(batch)
            elapsed = time.perf_counter() - start
        self.batches += 1
        self.busy_seconds += elapsed
        return out, elapsed

    def _hold_cores(self) -> AbstractContextManager[None]:
        if self.gate is None:
            return nullcontext()
        return self.gate.hold(self.threads, urgent=True) if self.urgent else self.gate.hold(self.threads)

    def warm_up(self, image_size: int, context_length: int) -> None:
        """Run every graph once (on CANN the first run compiles each static model), then time the
        batch buckets into `bucket_seconds`; fails loudly if a graph cannot run."""
        errors = engine_errors()
        for bucket, length in self.session.shapes:
            name = f"{self.session.tower} bucket {bucket}" + (f" length {length}" if length else "")
            start = time.perf_counter()
            try:
                out = self.session.run(dummy_batch(self.session.tower, bucket, image_size, length or context_length))
            except errors as exc:
                raise ModelError(f"{name} failed its warm-up run: {exc}") from exc
            if out.shape[0] != bucket:
                raise ModelError(f"{name} returned {out.shape[0]} rows")
            log.debug("warmed %s in %.3fs", name, time.perf_counter() - start)
        self.session.any_batch = self.session.any_batch_up_to()
        self.session.any_length = self.session.any_length_up_to()
        self._time_buckets(image_size, context_length)

    def _time_buckets(self, image_size: int, context_length: int) -> None:
        """Each batch bucket's run time at the full length (one yardstick for every text bucket): the
        fastest of `_TIMING_ROUNDS` runs taken in turns over the buckets, so a load spike slows all
        of them alike rather than one; a bucket whose run is long is timed once (long runs average
        the noise out, and start-up stays short)."""
        full = [bucket for bucket, length in self.session.shapes if length is None]
        batches = {bucket: dummy_batch(self.session.tower, bucket, image_size, context_length) for bucket in full}
        for round_ in range(_TIMING_ROUNDS):
            for bucket, batch in batches.items():
                if round_ and self.bucket_seconds[bucket] >= _RETIME_BELOW_S:
                    continue
                elapsed = _timed_run(self.session, batch)
                self.bucket_seconds[bucket] = min(elapsed, self.bucket_seconds.get(bucket, elapsed))

    def close(self) -> None:
        self.executor.shutdown(wait=True)


class StreamPool:
    """Idle streams of one tower; `acquire` returns the stream idle longest (the least busy)."""

    def __init__(self, streams: Sequence[Stream]) -> None:
        self.streams = list(streams)
        self._idle: asyncio.Queue[Stream] = asyncio.Queue()
        for stream in self.streams:
            self._idle.put_nowait(stream)

    async def acquire(self) -> Stream:
        return await self._idle.get()

    def release(self, stream: Stream) -> None:
        self._idle.put_nowait(stream)

    @property
    def idle(self) -> int:
        return self._idle.qsize()

    def close(self) -> None:
        for stream in self.streams:
            stream.close()
