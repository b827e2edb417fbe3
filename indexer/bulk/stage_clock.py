"""Where a bulk run's time goes (`IndexSummary.stages`, docs/indexing.md "Stage times").

Two kinds of measure, because the stages run differently:
- thread work (`read`, `decode`, `commit`, ...): the seconds spent inside the stage, summed over the
  threads that ran it. Two reader threads busy for 3 s each give 6 s: what the stage cost in cores.
- shared work (`encode`, `ocr`): the seconds during which at least one batch was in it. Several
  batches are in flight at once (they queue inside the encoder), and summing their waits would count
  the encoder's time once per batch waiting; the union of their intervals is the time it had work.

Both overlap the other stages, so the stages may add up to more than the run's wall time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal, TypeVar

from indexer.domain.index_summary import StageTimes

Stage = Literal["walk", "read", "decode", "core_wait", "encode", "commit", "vectors", "ocr"]
R = TypeVar("R")


class StageClock:
    """Adds time to a run's `StageTimes`, from the event loop and from worker threads alike."""

    def __init__(self, times: StageTimes | None = None) -> None:
        self.times = times if times is not None else StageTimes()
        self._lock = threading.Lock()
        self._busy: dict[Stage, tuple[int, float]] = {}  # shared stages: (batches in it, since when)
        self._nested = threading.local()  # per thread: the time of the blocks timed inside the open ones

    def add(self, stage: Stage, seconds: float) -> None:
        """`seconds` more of `stage` (thread work)."""
        name = f"{stage}_s"
        with self._lock:
            setattr(self.times, name, getattr(self.times, name) + max(0.0, seconds))

    @contextmanager
    def timing(self, stage: Stage) -> Iterator[None]:
        """Thread work: the time inside the block is added to `stage`, less the time of the blocks
        timed inside it in the same thread (a reader thread's decode is `decode`, not `read` too)."""
        inner: list[float] = getattr(self._nested, "stack", [])
        self._nested.stack = inner
        inner.append(0.0)
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            own = elapsed - inner.pop()
            if inner:
                inner[-1] += elapsed
            self.add(stage, own)

    def run(self, stage: Stage, work: Callable[[], R]) -> R:
        """`work()`, timed as `stage` (for work handed to worker threads)."""
        with self.timing(stage):
            return work()

    @contextmanager
    def sharing(self, stage: Stage) -> Iterator[None]:
        """Shared work: `stage` counts as busy while at least one block like this one is running."""
        with self._lock:
            count, since = self._busy.get(stage, (0, time.perf_counter()))
            self._busy[stage] = (count + 1, since if count else time.perf_counter())
        try:
            yield
        finally:
            with self._lock:
                count, since = self._busy[stage]
                self._busy[stage] = (count - 1, since)
                ended = time.perf_counter() if count == 1 else None
            if ended is not None:
                self.add(stage, ended - since)
