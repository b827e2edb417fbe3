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
from pathlib import Path
from typing import Protocol

import numpy as np

from retrieval.backends import SessionConfig, engine_errors
from retrieval.backends.onnxruntime import OrtSession
from retrieval.errors import ModelError
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

    def run(self, batch: np.ndarray) -> np.ndarray:
        """Run a batch whose size is exactly one of the buckets (and, for text, whose width is a length bucket)."""
        rows = len(batch)
        session = self.sessions.get((rows, batch.shape[1])) if batch.ndim == 2 else None
        session = session or self.sessions.get((rows, None))
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
        `config` shares one copy: the hot buckets `cnclip tune` found faster that way."""
        spec = manifest.towers[tower]
        shorter = [n for n in lengths if n < manifest.context_length] if tower == "text" else []
        sessions: dict[ShapeKey, ModelSession] = {}
        for length in [None, *shorter]:
            for b in buckets:
                path = manifest.graph_path(tower, precision, b, length)
                shape_config = config.unshared() if (b, length) in prepack else config
                sessions[(b, length)] = factory(path, shape_config, spec.input_name, spec.output_name)
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


class Stream:
    """One inference lane: a bucketed session and the single thread that runs it."""

    def __init__(self, index: int, session: BucketedSession, cores: Sequence[int] = (), pin: bool = False) -> None:
        self.index = index
        self.session = session
        self.cores = list(cores)
        self.batches = 0
        self.busy_seconds = 0.0
        initializer = self._pin_thread if pin and self.cores else None
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"{session.tower}-stream{index}", initializer=initializer
        )

    def _pin_thread(self) -> None:
        # On Linux, pid 0 means the calling thread: the thread that drives this stream's session.
        os.sched_setaffinity(0, {self.cores[0]})

    def run_timed(self, batch: np.ndarray) -> tuple[np.ndarray, float]:
        """Run in this stream's thread (call through `executor`); returns output and seconds."""
        start = time.perf_counter()
        out = self.session.run(batch)
        elapsed = time.perf_counter() - start
        self.batches += 1
        self.busy_seconds += elapsed
        return out, elapsed

    def warm_up(self, image_size: int, context_length: int) -> None:
        """Run every graph once (on CANN this compiles each static model); fails loudly if one cannot run."""
        errors = engine_errors()
        for bucket, length in self.session.shapes:
            start = time.perf_counter()
            name = f"{self.session.tower} bucket {bucket}" + (f" length {length}" if length else "")
            try:
                out = self.session.run(dummy_batch(self.session.tower, bucket, image_size, length or context_length))
            except errors as exc:
                raise ModelError(f"{name} failed its warm-up run: {exc}") from exc
            if out.shape[0] != bucket:
                raise ModelError(f"{name} returned {out.shape[0]} rows")
            log.debug("warmed %s in %.3fs", name, time.perf_counter() - start)

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
