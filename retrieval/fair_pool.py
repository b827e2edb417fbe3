"""Decode/preprocess workers shared fairly between requests.

One request's images used to go into a plain thread pool's FIFO, so a request of 150 large PNGs held
every worker for minutes and another client's single image waited behind all of them (issue 28).
Here each call of `FairPool.map` is one request with its own queue, and a free worker takes the next
image by turns:

- a request's first image goes before the turns of the requests already being served (the order in
  which first images arrived among themselves);
- after that, requests take one image each in turn (round-robin), however many images each holds.

So a request's first image starts after at most the images already being decoded (one per worker)
and the first images of requests that arrived just before it, one each; from then on it gets a
worker at least once in every round of the requests in progress. A request that fails (one of its
images is refused) or whose caller is cancelled (the client went away) drops the images it has not
started: only the ones already being decoded, at most one per worker, still run. Every future is
resolved: with the result, the image's own error, or `EncoderUnavailable` when the pool closes.

With a `gate` (retrieval/machine_limits.py `CoreGate`, the encoder's) each item holds one core
permit while it runs: decoding and the inference sessions together never run more threads than
cores, and the decodes fill the cores a batch leaves free (issue 34).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from retrieval.errors import EncoderUnavailable
from retrieval.machine_limits import CoreGate

T = TypeVar("T")
R = TypeVar("R")


class ItemFailed(Exception):
    """`FairPool.map`'s failure: the item at `index` raised `__cause__` (the remaining items were dropped)."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(f"item {index} failed: {error!r}")
        self.index = index
        self.error = error


@dataclass(eq=False)
class _Job(Generic[T, R]):
    fn: Callable[[T], R]
    item: T
    future: Future[R] = field(default_factory=Future)


@dataclass(eq=False)
class _Request:
    jobs: deque[_Job[Any, Any]]
    label: str = ""


class FairPool:
    """`workers` threads that run requests' items by turns (see the module docstring).

    `started` (tests, benchmarks) records the `label` of each item's request as a worker takes it,
    the last `history` of them: the order the pool actually served requests in."""

    def __init__(self, workers: int, name: str = "preprocess", history: int = 0, gate: CoreGate | None = None) -> None:
        if workers < 1:
            raise ValueError(f"a pool needs at least one worker, got {workers}")
        self.workers = workers
        self.gate = gate  # each item holds one of its permits while it runs (retrieval/machine_limits.py)
        self.started: deque[str] = deque(maxlen=history)
        self._cond = threading.Condition()
        self._fresh: deque[_Request] = deque()  # requests none of whose items has started yet
        self._turns: deque[_Request] = deque()  # requests being served, in turn order
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(workers)]
        for thread in self._threads:
            thread.start()

    @property
    def queued(self) -> int:
        """Items waiting for a worker, of all requests."""
        with self._cond:
            return sum(len(request.jobs) for queue in (self._fresh, self._turns) for request in queue)

    # --- scheduling (under the lock) -------------------------------------------------------------
    def _next_job(self) -> _Job[Any, Any] | None:
        for queue in (self._fresh, self._turns):
            while queue:
                request = queue.popleft()
                if not request.jobs:  # dropped (failed or cancelled) while it waited
                    continue
                job = request.jobs.popleft()
                if request.jobs:
                    self._turns.append(request)
                if self.started.maxlen:
                    self.started.append(request.label)
                return job
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                job = self._next_job()
                while job is None:
                    if self._closed:
                        return
                    self._cond.wait()
                    job = self._next_job()
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                with self.gate.hold(1) if self.gate is not None else nullcontext():
                    result = job.fn(job.item)
            except BaseException as exc:  # handed to the awaiting request, never lost in this thread
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)
            del job  # do not hold the item (image bytes) while waiting for the next one

    # --- requests ----------------------------------------------------------------------------------
    def submit(self, fn: Callable[[T], R], items: Sequence[T], label: str = "") -> tuple[_Request, list[Future[R]]]:
        """Queue one request's items; the futures resolve in the request's turns. Prefer `map`."""
        jobs: deque[_Job[Any, Any]] = deque(_Job(fn, item) for item in items)
        futures = [job.future for job in jobs]
        request = _Request(jobs, label)
        with self._cond:
            if self._closed:
                raise EncoderUnavailable("the encoder is closing")
            if jobs:
                self._fresh.append(request)
                self._cond.notify(min(len(jobs), self.workers))
        return request, futures

    def drop(self, request: _Request) -> None:
        """Forget the request's items that have not started (their futures are cancelled)."""
        with self._cond:
            dropped = list(request.jobs)
            request.jobs.clear()
        for job in dropped:
            job.future.cancel()

    async def map(self, fn: Callable[[T], R], items: Sequence[T], label: str = "") -> list[R]:
        """`fn(item)` for every item, in order, run by the pool in this request's turns.

        The first item to fail stops the request: the items not started are dropped and `ItemFailed`
        (its `index`, the error as `error` and `__cause__`) is raised. Cancelling the awaiting task
        drops them too."""
        request, futures = self.submit(fn, items, label)
        waiting = [asyncio.wrap_future(future) for future in futures]
        if not waiting:
            return []
        try:
            done, pending = await asyncio.wait(waiting, return_when=asyncio.FIRST_EXCEPTION)
        except BaseException:  # cancelled: the client went away, free its turns
            self.drop(request)
            raise
        if pending:
            self.drop(request)
            for future in pending:
                future.cancel()
        # Each failure is read (asyncio logs one never retrieved); the first by index is the one reported.
        errors = [(i, f.exception()) for i, f in enumerate(waiting) if f in done and not f.cancelled()]
        for index, error in errors:
            if error is not None:
                raise ItemFailed(index, error) from error
        return [future.result() for future in waiting]

    def close(self) -> None:
        """Stop taking requests; what is queued fails with `EncoderUnavailable`, the workers end after
        the item each is running (not waited for)."""
        with self._cond:
            self._closed = True
            queued = [job for queue in (self._fresh, self._turns) for request in queue for job in request.jobs]
            for queue in (self._fresh, self._turns):
                for request in queue:
                    request.jobs.clear()
                queue.clear()
            self._cond.notify_all()
        for job in queued:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(EncoderUnavailable("the encoder closed before this image was decoded"))
