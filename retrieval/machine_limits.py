"""How many threads a setting or a tuning file may start: bounded by the cores this process may run
on (`os.sched_getaffinity`, which a container's CPU set or `taskset` narrows). The one rule for
`CNCLIP_STREAMS`, `CNCLIP_THREADS_PER_STREAM`, `CNCLIP_INDEX_READ_THREADS` and a tuning file's
`streams` / `threads_per_stream`, and of `CoreGate`: the compute threads that run at once.

Why: the tuning file's schema allowed `threads_per_stream` 4096; a file with it started 4,613
threads and drove the load average to 295. More inference threads than cores never runs faster
(they take turns on the same cores and spin while they wait), so a tower's streams × threads per
stream may not exceed the cores. Reading files waits on the disk more than on a core, so readers may
be `IO_THREADS_PER_CORE` times the cores. Memory is bounded apart: every stream's weight copies
count against `CNCLIP_MEMORY_BUDGET_MB` (retrieval/memory_budget.py).

Why a gate as well (issue 34): each tower's streams may use every core, and so may the image decode
workers; a text batch, an image batch and two decodes at once ran 3× the cores' threads on a 2-core
machine (spinning ONNX Runtime pools among them), and throughput fell as concurrency rose. Every
compute thread of the local encoder now holds a share of one `CoreGate` of `usable_cores()`
permits while it computes: a stream its intra-op threads, a decode worker one.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

IO_THREADS_PER_CORE = 4


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def inference_threads_refusal(streams: int, threads_per_stream: int, cores: int | None = None) -> str | None:
    """Why `streams` sessions of `threads_per_stream` intra-op threads each (0: an equal share of the
    cores) cannot run here, in words; None when they can."""
    cores = cores or usable_cores()
    if streams > cores:
        return f"{streams} streams, but this process may run on {cores} cores (at most {cores} streams)"
    if streams * max(threads_per_stream, 1) > cores:
        return (
            f"{streams} stream(s) × {threads_per_stream} threads = {streams * threads_per_stream} threads, but this "
            f"process may run on {cores} cores (threads_per_stream 0 shares them out)"
        )
    return None


def io_threads_refusal(threads: int, cores: int | None = None) -> str | None:
    """Why `threads` file-reading threads are too many here; None when they are not."""
    most = IO_THREADS_PER_CORE * (cores or usable_cores())
    if threads > most:
        return f"{threads} threads, but at most {most} ({IO_THREADS_PER_CORE} per core this process may run on)"
    return None


def runnable_threads(exclude: Collection[int] = ()) -> int:
    """Threads of this process running or waiting for a core right now (state R in
    /proc/self/task/*/stat), those in `exclude` (native thread ids) left out; 0 where /proc is absent."""
    count = 0
    for task in Path("/proc/self/task").glob("*"):
        if not task.name.isdigit() or int(task.name) in exclude:
            continue
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended between the listing and the read
            continue
        # The state follows the command name, which is in parentheses and may itself hold spaces.
        if stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] == "R":
            count += 1
    return count


@dataclass(eq=False)
class _Waiter:
    wanted: int
    urgent: bool
    wake: threading.Condition
    since: float = field(default_factory=time.monotonic)
    granted: bool = False


class CoreGate:
    """`cores` permits that compute threads hold while they run: never more threads at work than cores.

    `hold(n)` waits until `n` permits are free; `n` above `cores` takes them all, 0 takes none (a
    session on an accelerator). Permits go to the waiters in line order, first come first served
    (a batch of a 2-thread stream is not starved by a flow of 1-thread decodes), except that an
    `urgent` waiter (a text query's batch: short, and a person waits for it) goes before the others
    while the oldest of them has waited less than `overtake_s` — so a query does not wait behind
    queued decodes and image batches, and they still get their turn under a flood of queries. Only
    the waiter served is woken (no herd competing for the cores it waits for). `peak` is the most
    permits ever held at once."""

    def __init__(self, cores: int | None = None, overtake_s: float = 0.05) -> None:
        self.cores = cores or usable_cores()
        self.overtake_s = overtake_s
        self.peak = 0
        self._free = self.cores
        self._line: deque[_Waiter] = deque()
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        with self._lock:
            return self.cores - self._free

    def _next(self) -> _Waiter | None:
        """Under the lock: who is served next (see the class docstring)."""
        if not self._line or self._line[0].urgent:
            return self._line[0] if self._line else None
        urgent = next((waiter for waiter in self._line if waiter.urgent), None)
        if urgent is not None and time.monotonic() - self._line[0].since < self.overtake_s:
            return urgent
        return self._line[0]

    def _grant(self) -> None:
        """Under the lock: hand free permits to the next waiter while it fits (nobody passes one that
        does not: it would wait for ever behind narrower ones)."""
        while (waiter := self._next()) is not None and waiter.wanted <= self._free:
            self._line.remove(waiter)
            self._free -= waiter.wanted
            self.peak = max(self.peak, self.cores - self._free)
            waiter.granted = True
            waiter.wake.notify()

    @contextmanager
    def hold(self, threads: int, urgent: bool = False) -> Iterator[None]:
        wanted = min(max(threads, 0), self.cores)
        if wanted == 0:
            yield
            return
        with self._lock:
            waiter = _Waiter(wanted, urgent, threading.Condition(self._lock))
            self._line.append(waiter)
            self._grant()
            try:
                while not waiter.granted:
                    # Timed: an urgent waiter's overtaking ends by the clock, not only when one releases.
                    waiter.wake.wait(self.overtake_s)
                    self._grant()
            except BaseException:  # interrupted while waiting: leave the line, give back what came meanwhile
                if waiter.granted:
                    self._free += wanted
                else:
                    self._line.remove(waiter)
                self._grant()
                raise
        try:
            yield
        finally:
            with self._lock:
                self._free += wanted
                self._grant()
