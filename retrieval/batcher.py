"""The dynamic batcher: merges concurrent requests of one tower into bucket-sized batches.

Requests enter a bounded queue of rows. One dispatcher task waits until the queue can fill the
largest bucket or the oldest row has waited `max_delay_s` (it does not wait at all when no batch is
in flight: an idle encoder gains nothing by waiting), takes an idle stream, and cuts a batch:
the bucket whose run costs the fewest seconds per real row: a full bucket, or the rows present
padded up to the next bucket. Padding 3 rows up to 8 pays only where the 8-row graph runs them
faster than smaller graphs would (issue 34: shared-weight batched graphs may be slower per row
than batch 1). Each bucket's time is measured once, at warm-up (fixed since: the same rows
are cut the same way, so a request's int8 vectors do not drift with the load); without times (fakes)
a rule of thumb on rows decides. Padding rows copy a real row and are dropped before
anything is returned. Where every stream runs any batch size (ONNX Runtime's one shape-dynamic
session per stream on the CPU, retrieval/backends/ort_batch.py), the rows waiting run as they are,
up to the largest bucket: nothing is padded. Text requests come cut to their length bucket (see `retrieval/text_lengths.py`);
a batch mixing lengths runs at its longest, the shorter rows zero-padded (padding is masked, so their
vectors do not change).

Guarantees: every request's future is resolved (vectors, or an exception with the cause); a full
queue raises `Overloaded` at once; rows of a cancelled request are dropped before inference; a
batch that fails fails only the requests in it, and the dispatcher keeps serving.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from retrieval.errors import CnclipError, EncoderUnavailable, ModelError, Overloaded
from retrieval.sessions import Stream, StreamPool
from retrieval.types import EncoderObserver

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Request:
    inputs: np.ndarray
    future: asyncio.Future[np.ndarray]
    enqueued: float
    preprocess_s: float
    taken: int = 0  # rows already cut into batches
    done_rows: int = 0
    out: np.ndarray | None = None

    @property
    def waiting(self) -> int:
        return len(self.inputs) - self.taken


@dataclass
class _Batch:
    pieces: list[tuple[_Request, int, int]] = field(default_factory=list)  # (request, start, stop)
    rows: int = 0
    bucket: int = 0


def choose_batch(
    available: int, buckets: Sequence[int], bucket_seconds: Mapping[int, float] | None = None
) -> tuple[int, int]:
    """(rows to take, bucket to run) for `available` due rows; buckets sorted ascending.

    With `bucket_seconds` (a run's time per bucket, measured at warm-up) the bucket that costs the
    fewest seconds per real row: padding only where the bigger graph is that much cheaper per row
    (the smaller bucket on a tie: less latency). Without, a rule of thumb on rows alone."""
    if bucket_seconds and all(bucket_seconds.get(b, 0) > 0 for b in buckets):
        per_row = {b: bucket_seconds[b] / b for b in buckets if b <= available}  # full buckets
        up = next((b for b in buckets if b >= available), None)  # the one bucket worth padding up to
        if up is not None:
            per_row[up] = bucket_seconds[up] / available
        bucket = min(per_row, key=lambda b: (per_row[b], b))
        return min(bucket, available), bucket
    largest = buckets[-1]
    if available >= largest:
        return largest, largest
    up = buckets[bisect.bisect_left(buckets, available)]
    if up == available:
        return available, available
    below = [b for b in buckets if b <= available]
    # Pad up when that wastes no more rows than running the exact smaller bucket leaves waiting.
    if not below or up - available <= available - below[-1]:
        return available, up
    return below[-1], below[-1]


def assemble(parts: Sequence[np.ndarray], padding_rows: int) -> np.ndarray:
    """One batch input from the pieces' rows plus `padding_rows` copies of the first row.

    2-D (token id) pieces of different widths are zero-padded to the widest: 0 is the padding token."""
    if parts[0].ndim == 2:
        width = max(part.shape[1] for part in parts)
        parts = [
            part if part.shape[1] == width else np.pad(part, ((0, 0), (0, width - part.shape[1]))) for part in parts
        ]
    if padding_rows:
        parts = [*parts, np.repeat(parts[0][:1], padding_rows, axis=0)]
    return np.ascontiguousarray(np.concatenate(parts))


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, np.float32(1e-12))


class DynamicBatcher:
    """One tower's queue, dispatcher and batch runs over a `StreamPool`."""

    def __init__(
        self,
        tower: str,
        pool: StreamPool,
        buckets: Sequence[int],
        max_delay_s: float,
        max_queue_size: int,
        merge_requests: bool = True,
        observer: EncoderObserver | None = None,
        bucket_seconds: Mapping[int, float] | None = None,
        any_batch: int = 0,
    ) -> None:
        self.tower = tower
        self.pool = pool
        self.buckets = sorted(buckets)
        self.max_delay_s = max_delay_s
        self.max_queue_size = max_queue_size
        self.merge_requests = merge_requests
        self.observer = observer
        self.bucket_seconds = dict(bucket_seconds or {})
        # The streams run any batch size up to this unpadded (one shape-dynamic session each): cut
        # every row waiting, up to it, and pad nothing. 0: bucket sizes, chosen by `choose_batch`.
        self.any_batch = min(any_batch, self.buckets[-1]) if any_batch and self.buckets else 0
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        self._arrived = asyncio.Event()
        self._dispatcher: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._closing = False
        # Rows in circulation when the last batch ended (its own plus those waiting), and until when
        # their callers' next requests are worth waiting for (`_wait_for_returning`).
        self._expected_rows = 0
        self._expected_until = 0.0

    # --- public ------------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        """Rows waiting for a batch (not yet handed to a stream)."""
        return self._queued_rows

    def check_capacity(self, rows: int) -> None:
        """Raise `Overloaded` now if `rows` more would not fit (call before costly preprocessing)."""
        if self._closing:
            raise EncoderUnavailable("the encoder is shutting down")
        if self._queued_rows + rows > self.max_queue_size:
            raise Overloaded(
                f"the {self.tower} encoder queue is full ({self._queued_rows} of {self.max_queue_size} rows waiting)"
            )

    async def submit(self, inputs: np.ndarray, preprocess_s: float = 0.0) -> np.ndarray:
        """Queue `inputs` (n rows of one tower's input) and wait for their L2-normalised vectors."""
        if len(inputs) == 0:
            raise ValueError("submit needs at least one row")
        self.check_capacity(len(inputs))
        if self._dispatcher is None:
            raise EncoderUnavailable(f"the {self.tower} encoder is not started")
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(inputs, future, time.perf_counter(), preprocess_s))
        self._queued_rows += len(inputs)
        self._arrived.set()
        return await future

    def start(self) -> None:
        self._dispatcher = asyncio.create_task(self._dispatch_forever(), name=f"{self.tower}-batcher")
        self._dispatcher.add_done_callback(self._dispatcher_ended)

    def _dispatcher_ended(self, task: asyncio.Task[None]) -> None:
        # Only a bug ends the dispatcher early; then nothing queued may hang.
        if not task.cancelled() and task.exception() is not None:
            log.error("%s batcher stopped", self.tower, exc_info=task.exception())
            self._closing = True
            self._fail_queued(EncoderUnavailable(f"the {self.tower} encoder stopped; its log says why"))

    async def close(self) -> None:
        """Fail what is queued, let running batches finish, stop the dispatcher."""
        self._closing = True
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
        self._fail_queued(EncoderUnavailable(f"the {self.tower} encoder is shutting down"))
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    # --- dispatcher ----------------------------------------------------------------------------
    def _drop_dead_head(self) -> None:
        """Forget requests at the head whose callers have gone (cancelled) or were already failed."""
        while self._queue and self._queue[0].future.done():
            dead = self._queue.popleft()
            self._queued_rows -= dead.waiting

    def _live_rows(self) -> int:
        for request in [r for r in self._queue if r.future.done()]:
            self._queue.remove(request)
            self._queued_rows -= request.waiting
        return self._queued_rows

    async def _wait_until_due(self) -> None:
        """Until the queue fills the largest bucket or its oldest row has waited max_delay_s."""
        while True:
            self._drop_dead_head()
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            if not self.merge_requests or self._queued_rows >= self.buckets[-1]:
                return
            if not self._running:
                # Nothing in flight: waiting would only add latency. Under load batches are in flight,
                # and rows that arrive meanwhile merge (up to the delay, or until a stream frees up).
                return
            if not await self._arrival_before(self._queue[0].enqueued + self.max_delay_s):
                return

    async def _wait_for_returning(self) -> None:
        """Right after a batch, until as many rows wait as were in circulation when it ended, or
        `max_delay_s` after it ended. Callers in a closed loop (a client pool, a load tool, a UI
        typing) send their next request a round trip after their answer: cutting at once ran the one
        row that waited alone and every returning row a whole run later — at 8 callers, batches of
        1 and 7 in turn (issue 34). Never longer than the delay; the next wait expects what came."""
        if not self.merge_requests:
            return
        while self._live_rows() < self._expected_rows:
            if not await self._arrival_before(self._expected_until):
                return

    async def _arrival_before(self, deadline: float) -> bool:
        """Whether a request arrives before `deadline` (perf_counter seconds); False at once when it has passed."""
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return False
        self._arrived.clear()
        try:
            await asyncio.wait_for(self._arrived.wait(), remaining)
        except TimeoutError:
            return False
        return True

    def _cut_batch(self) -> _Batch | None:
        available = self._live_rows()
        if available == 0:
            return None
        due = available if self.merge_requests else min(self._queue[0].waiting, self.buckets[-1])
        if self.any_batch:
            rows = bucket = min(due, self.any_batch)
        else:  # merged rows, or one request (or a largest-bucket slice of it) per batch
            rows, bucket = choose_batch(due, self.buckets, self.bucket_seconds)
        batch = _Batch(rows=rows, bucket=bucket)
        need = rows
        while need:
            request = self._queue[0]
            take = min(need, request.waiting)
            batch.pieces.append((request, request.taken, request.taken + take))
            request.taken += take
            need -= take
            self._queued_rows -= take
            if request.waiting == 0:
                self._queue.popleft()
        return batch

    async def _dispatch_forever(self) -> None:
        while True:
            await self._wait_until_due()
            stream = await self.pool.acquire()
            await self._wait_for_returning()
            batch = self._cut_batch()
            if batch is None:  # everything waiting was cancelled meanwhile
                self.pool.release(stream)
                continue
            task = asyncio.create_task(self._run(stream, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    # --- one batch -------------------------------------------------------------------------------
    def _infer(self, stream: Stream, batch_input: np.ndarray, rows: int) -> tuple[np.ndarray, float, float]:
        """In the stream's thread: run the bucket graph, then normalise the real rows."""
        out, inference_s = stream.run_timed(batch_input)
        start = time.perf_counter()
        if out.ndim != 2 or out.shape[0] != len(batch_input):
            raise ModelError(f"{self.tower} graph returned shape {out.shape} for a batch of {len(batch_input)}")
        vectors = l2_normalise(out[:rows])
        return vectors, inference_s, time.perf_counter() - start

    async def _run(self, stream: Stream, batch: _Batch) -> None:
        started = time.perf_counter()
        queue_s = started - min(r.enqueued for r, _, _ in batch.pieces)
        timings = {"queue": queue_s, "preprocess": sum(r.preprocess_s for r, s, _ in batch.pieces if s == 0)}
        try:
            # Padded with copies of a real row: always a valid input.
            batch_input = assemble([r.inputs[a:b] for r, a, b in batch.pieces], batch.bucket - batch.rows)
            loop = asyncio.get_running_loop()
            vectors, timings["inference"], post_s = await loop.run_in_executor(
                stream.executor, self._infer, stream, batch_input, batch.rows
            )
        except asyncio.CancelledError:
            self._fail_pieces(batch, EncoderUnavailable(f"the {self.tower} encoder is shutting down"))
            raise
        except Exception as exc:  # noqa: BLE001 - handed to exactly the requests of this batch, with the cause
            log.exception("%s batch of %d (bucket %d) failed", self.tower, batch.rows, batch.bucket)
            if isinstance(exc, CnclipError):
                self._fail_pieces(batch, exc)
            else:
                error = ModelError(f"{self.tower} inference failed: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
                self._fail_pieces(batch, error)
            return
        else:
            # Hand results back before the stream is free again: callers waiting in a closed loop
            # can resubmit and join the next batch instead of trailing one behind.
            scatter_start = time.perf_counter()
            self._scatter(batch, vectors)
            post_s += time.perf_counter() - scatter_start
            self._expected_rows = min(batch.rows + self._live_rows(), self.buckets[-1])
            self._expected_until = time.perf_counter() + self.max_delay_s
        finally:
            self.pool.release(stream)
        timings["post"] = post_s
        self._report(batch, timings)

    @staticmethod
    def _scatter(batch: _Batch, vectors: np.ndarray) -> None:
        offset = 0
        for request, a, b in batch.pieces:
            if not request.future.done():
                if request.out is None:
                    request.out = np.empty((len(request.inputs), vectors.shape[1]), dtype=np.float32)
                request.out[a:b] = vectors[offset : offset + (b - a)]
                request.done_rows += b - a
                if request.done_rows == len(request.inputs):
                    request.future.set_result(request.out)
            offset += b - a

    def _report(self, batch: _Batch, timings: dict[str, float]) -> None:
        if self.observer is None:
            return
        try:
            self.observer.batch_done(self.tower, batch.bucket, batch.rows, timings)
        except Exception:  # noqa: BLE001 - a metrics bug must not break serving; logged with its traceback
            log.exception("encoder observer failed")

    def _fail_pieces(self, batch: _Batch, error: BaseException) -> None:
        for request, _, _ in batch.pieces:
            if not request.future.done():
                request.future.set_exception(error)

    def _fail_queued(self, error: BaseException) -> None:
        while self._queue:
            request = self._queue.popleft()
            if not request.future.done():
                request.future.set_exception(error)
        self._queued_rows = 0
