"""The dynamic batcher with fake sessions: bucket choice, merging, splitting, padding, overload,
cancellation, failing batches, shutdown, streams and the observer."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from retrieval.batcher import DynamicBatcher, choose_batch
from retrieval.errors import EncoderUnavailable, ModelError, Overloaded
from retrieval.sessions import BucketedSession, Stream, StreamPool

BUCKETS = [1, 4, 8, 16, 32]
POISON = -1.0


class FakeSession:
    """Row i's vector is [value, 1]: a row maps to itself, so results show where each row went.

    Records every batch; a batch holding a POISON row raises; `gate` (if set) holds runs until opened.
    """

    def __init__(self, log: list, delay: float = 0.0, gate: threading.Event | None = None) -> None:
        self.log = log
        self.delay = delay
        self.gate = gate

    def run(self, batch: np.ndarray) -> np.ndarray:
        started = time.perf_counter()
        if self.gate is not None:
            assert self.gate.wait(5)
        if self.delay:
            time.sleep(self.delay)
        self.log.append((len(batch), batch[:, 0].tolist(), started, time.perf_counter()))
        if (batch[:, 0] == POISON).any():
            raise RuntimeError("poisoned row")
        return np.stack([batch[:, 0], np.ones(len(batch))], axis=1).astype(np.float32)


def make_batcher(
    runs: list,
    streams: int = 1,
    delay_ms: float = 20.0,
    queue: int = 256,
    merge: bool = True,
    session_delay: float = 0.0,
    gate: threading.Event | None = None,
    observer=None,
) -> DynamicBatcher:
    pool = StreamPool(
        [
            Stream(i, BucketedSession("text", {b: FakeSession(runs, session_delay, gate) for b in BUCKETS}))
            for i in range(streams)
        ]
    )
    batcher = DynamicBatcher("text", pool, BUCKETS, delay_ms / 1000, queue, merge_requests=merge, observer=observer)
    batcher.start()
    return batcher


async def until(condition, timeout: float = 5.0) -> None:
    """Poll instead of sleeping a fixed time: the CI machine may be busy."""
    deadline = time.perf_counter() + timeout
    while not condition():
        assert time.perf_counter() < deadline, "condition not reached"
        await asyncio.sleep(0.002)


def busy(batcher: DynamicBatcher) -> bool:
    return batcher.pool.idle == 0 and batcher.queue_depth == 0


def rows(*values: float) -> np.ndarray:
    return np.array([[v] for v in values], dtype=np.float32)


def expected(*values: float) -> np.ndarray:
    v = np.array([[x, 1.0] for x in values], dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.mark.parametrize(
    ("available", "want"),
    [
        (1, (1, 1)),
        (3, (3, 4)),  # pad 1 rather than run 1 and leave 2
        (4, (4, 4)),
        (5, (4, 4)),  # exact 4, the last one follows
        (7, (7, 8)),
        (11, (8, 8)),
        (15, (15, 16)),
        (16, (16, 16)),
        (32, (32, 32)),
        (40, (32, 32)),  # split above the largest bucket
    ],
)
def test_choose_batch(available: int, want: tuple[int, int]) -> None:
    assert choose_batch(available, BUCKETS) == want


def test_choose_batch_without_bucket_one() -> None:
    assert choose_batch(2, [4, 8]) == (2, 4)


# Seconds per run: batched graphs slower per row than batch 1 (shared, not prepacked, weights on a CPU
# where that hurts), and graphs that batch well (prepacked): per row 1.0 at b1, 0.25 at b16.
SLOW_BATCHES = {1: 1.0, 8: 9.0, 16: 18.0}
FAST_BATCHES = {1: 1.0, 8: 2.4, 16: 4.0}


@pytest.mark.parametrize(
    ("available", "seconds", "want"),
    [
        (1, SLOW_BATCHES, (1, 1)),
        (3, SLOW_BATCHES, (1, 1)),  # 3 rows padded to 8 cost 9 s; three runs of b1, 3 s
        (4, SLOW_BATCHES, (1, 1)),
        (8, SLOW_BATCHES, (1, 1)),  # even a full 8 is slower per row than b1 here
        (1, FAST_BATCHES, (1, 1)),  # b8 padded for 1 row: 2.4 s against 1 s
        (2, FAST_BATCHES, (1, 1)),  # 1.2 s a row padded to 8: b1 wins
        (3, FAST_BATCHES, (3, 8)),  # 0.8 s a row padded to 8: padding pays
        (9, FAST_BATCHES, (8, 8)),  # a full 8 at 0.3 s a row beats 16 padded for 9 (0.44)
        (20, FAST_BATCHES, (16, 16)),
    ],
)
def test_choose_batch_pads_only_where_the_bigger_graph_is_cheaper_per_row(
    available: int, seconds: dict[int, float], want: tuple[int, int]
) -> None:
    assert choose_batch(available, sorted(seconds), seconds) == want


def test_measured_bucket_times_keep_a_few_requests_off_a_slow_batch() -> None:
    """3 requests waiting, buckets 1/4/8/...: with b4 measured slower per row than b1, they run as b1s
    instead of one batch padded 3 → 4 (the rule of thumb's choice, test above)."""

    async def scenario():
        runs: list = []
        seconds = {b: 2.0 * b for b in BUCKETS} | {1: 1.0}
        pool = StreamPool([Stream(0, BucketedSession("text", {b: FakeSession(runs) for b in BUCKETS}))])
        batcher = DynamicBatcher("text", pool, BUCKETS, 0.02, 256, bucket_seconds=seconds)
        batcher.start()
        results = await asyncio.gather(*(batcher.submit(rows(v)) for v in (1.0, 2.0, 3.0)))
        await batcher.close()
        return runs, results

    runs, results = asyncio.run(scenario())
    assert [r[0] for r in runs] == [1, 1, 1]
    for value, result in zip((1.0, 2.0, 3.0), results, strict=True):
        assert np.allclose(result, expected(value))


def test_concurrent_requests_merge_and_padding_never_leaks() -> None:
    async def scenario():
        runs: list = []
        batcher = make_batcher(runs)
        results = await asyncio.gather(*(batcher.submit(rows(v)) for v in (1.0, 2.0, 3.0)))
        await batcher.close()
        return runs, results

    runs, results = asyncio.run(scenario())
    assert [r[0] for r in runs] == [4]  # one batch, padded 3 → 4
    assert runs[0][1] == [1.0, 2.0, 3.0, 1.0]  # the pad row copies a real row
    for value, result in zip((1.0, 2.0, 3.0), results, strict=True):
        assert result.shape == (1, 2) and np.allclose(result, expected(value))


def test_large_request_is_split_above_the_largest_bucket() -> None:
    async def scenario():
        runs: list = []
        batcher = make_batcher(runs)
        values = [float(i + 1) for i in range(43)]
        result = await batcher.submit(rows(*values))
        await batcher.close()
        return runs, values, result

    runs, values, result = asyncio.run(scenario())
    assert [r[0] for r in runs] == [32, 8, 4]  # 43 = 32 + 8 + 3 padded to 4
    assert np.allclose(result, expected(*values))


def test_waits_up_to_the_delay_to_fill_a_bucket_while_busy() -> None:
    async def scenario():
        runs: list = []
        gate = threading.Event()
        batcher = make_batcher(runs, streams=2, delay_ms=300, gate=gate)
        busy_one = asyncio.create_task(batcher.submit(rows(9.0)))  # idle encoder: runs at once
        await until(lambda: batcher.pool.idle == 1)
        first = asyncio.create_task(batcher.submit(rows(1.0)))  # one batch in flight: waits for company
        await asyncio.sleep(0.02)
        second = asyncio.create_task(batcher.submit(rows(2.0, 3.0, 4.0)))
        await asyncio.sleep(0.02)
        gate.set()
        await asyncio.gather(busy_one, first, second)
        await batcher.close()
        return runs

    assert [r[1] for r in asyncio.run(scenario())] == [[9.0], [1.0, 2.0, 3.0, 4.0]]


def test_idle_encoder_does_not_wait_for_company() -> None:
    async def scenario():
        runs: list = []
        batcher = make_batcher(runs, delay_ms=2000)
        start = time.perf_counter()
        await batcher.submit(rows(1.0))
        elapsed = time.perf_counter() - start
        await batcher.close()
        return elapsed

    assert asyncio.run(scenario()) < 1.0


def test_closed_loop_callers_run_together_not_one_then_the_rest() -> None:
    """Eight callers that each send their next request a round trip after their answer: cut at once,
    the one row waiting ran alone and the seven returning ones a run later, in turn (issue 34)."""

    async def scenario():
        runs: list = []
        batcher = make_batcher(runs, delay_ms=200, session_delay=0.02)

        async def caller(i: int) -> None:
            for _ in range(6):
                await batcher.submit(rows(float(i)))
                await asyncio.sleep(0.002 * (i + 1))  # the answer's way back and the next request's way in

        await asyncio.gather(*(caller(i) for i in range(8)))
        await batcher.close()
        return [r[1] for r in runs]

    batches = asyncio.run(scenario())
    real = [[v for v in b if v >= 0] for b in batches]
    assert sum(len(set(b)) for b in real) == 48
    # Not 8, then 1 and 7 in turn: every batch holds all eight callers.
    assert all(len(set(b)) == 8 for b in real), [len(set(b)) for b in real]


def test_a_caller_that_does_not_return_costs_at_most_the_delay() -> None:
    async def scenario():
        runs: list = []
        gate = threading.Event()
        batcher = make_batcher(runs, delay_ms=150, gate=gate)
        first = asyncio.create_task(batcher.submit(rows(1.0)))
        await until(lambda: batcher.pool.idle == 0)
        others = asyncio.gather(*(batcher.submit(rows(v)) for v in (2.0, 3.0, 5.0, 6.0)))
        await asyncio.sleep(0.01)
        gate.set()
        await first
        await others  # a batch of 4 ended: 4 rows expected back, only one comes
        start = time.perf_counter()
        await batcher.submit(rows(4.0))
        waited = time.perf_counter() - start
        await batcher.close()
        return waited, [r[1] for r in runs]

    waited, batches = asyncio.run(scenario())
    assert batches[1] == [2.0, 3.0, 5.0, 6.0] and batches[2] == [4.0]
    assert 0.1 < waited < 1.0  # it waited for the other callers, but no longer than the delay


def test_zero_delay_does_not_wait() -> None:
    async def scenario():
        runs: list = []
        batcher = make_batcher(runs, delay_ms=0)
        start = time.perf_counter()
        await batcher.submit(rows(1.0))
        elapsed = time.perf_counter() - start
        await batcher.close()
        return elapsed

    assert asyncio.run(scenario()) < 0.5


def test_without_merging_each_request_runs_alone() -> None:
    async def scenario():
        runs: list = []
        batcher = make_batcher(runs, merge=False)
        await asyncio.gather(*(batcher.submit(rows(v)) for v in (1.0, 2.0, 3.0)))
        await batcher.submit(rows(5.0, 6.0, 7.0))
        await batcher.close()
        return runs

    assert [r[0] for r in asyncio.run(scenario())] == [1, 1, 1, 4]


def test_full_queue_raises_overloaded_and_recovers() -> None:
    async def scenario():
        runs: list = []
        gate = threading.Event()
        batcher = make_batcher(runs, queue=8, delay_ms=0, gate=gate)
        running = asyncio.create_task(batcher.submit(rows(1.0)))  # occupies the only stream
        await until(lambda: busy(batcher))
        queued = asyncio.create_task(batcher.submit(rows(*[2.0] * 8)))  # fills the queue
        await until(lambda: batcher.queue_depth == 8)
        with pytest.raises(Overloaded) as info:
            await batcher.submit(rows(3.0))
        gate.set()
        await asyncio.gather(running, queued)
        after = await batcher.submit(rows(4.0))  # still serving
        await batcher.close()
        return info.value, after

    error, after = asyncio.run(scenario())
    assert error.code == "overloaded" and "queue is full" in error.message
    assert np.allclose(after, expected(4.0))


def test_cancelled_request_is_dropped_before_inference() -> None:
    async def scenario():
        runs: list = []
        gate = threading.Event()
        batcher = make_batcher(runs, delay_ms=0, gate=gate)
        running = asyncio.create_task(batcher.submit(rows(1.0)))
        await until(lambda: busy(batcher))
        doomed = asyncio.create_task(batcher.submit(rows(7.0, 7.0)))
        kept = asyncio.create_task(batcher.submit(rows(8.0)))
        await until(lambda: batcher.queue_depth == 3)
        doomed.cancel()
        gate.set()
        await asyncio.gather(running, kept)
        depth = batcher.queue_depth
        await batcher.close()
        return runs, doomed, depth

    runs, doomed, depth = asyncio.run(scenario())
    assert doomed.cancelled() and depth == 0
    assert all(7.0 not in values for _, values, _, _ in runs)
    assert [values for _, values, _, _ in runs] == [[1.0], [8.0]]


def test_failing_batch_fails_only_its_requests_and_the_worker_survives() -> None:
    async def scenario():
        runs: list = []
        batcher = make_batcher(runs, delay_ms=30)
        # Two merged requests in one batch (one poisoned), then a request in a later batch.
        bad = batcher.submit(rows(POISON))
        neighbours = [batcher.submit(rows(2.0)), batcher.submit(rows(2.5))]
        outcomes = await asyncio.gather(bad, *neighbours, return_exceptions=True)
        later = await batcher.submit(rows(3.0))
        await batcher.close()
        return runs, outcomes, later

    runs, outcomes, later = asyncio.run(scenario())
    assert [r[0] for r in runs] == [4, 1]
    for outcome in outcomes:  # both were in the failing batch
        assert isinstance(outcome, ModelError) and "poisoned row" in outcome.message
        assert isinstance(outcome.__cause__, RuntimeError)
    assert np.allclose(later, expected(3.0))


def test_failure_does_not_touch_other_batches() -> None:
    async def scenario():
        runs: list = []
        batcher = make_batcher(runs, delay_ms=0)
        good = await batcher.submit(rows(*[1.0] * 32))
        with pytest.raises(ModelError):
            await batcher.submit(rows(POISON))
        good_again = await batcher.submit(rows(*[2.0] * 4))
        await batcher.close()
        return good, good_again

    good, good_again = asyncio.run(scenario())
    assert good.shape == (32, 2) and good_again.shape == (4, 2)


def test_close_resolves_every_queued_future() -> None:
    async def scenario():
        runs: list = []
        gate = threading.Event()
        batcher = make_batcher(runs, delay_ms=0, gate=gate)
        running = asyncio.create_task(batcher.submit(rows(1.0)))
        await until(lambda: busy(batcher))
        queued = [asyncio.create_task(batcher.submit(rows(float(i)))) for i in range(5)]
        await until(lambda: batcher.queue_depth == 5)
        closing = asyncio.create_task(batcher.close())
        await asyncio.sleep(0.01)
        gate.set()
        await closing
        outcomes = await asyncio.gather(running, *queued, return_exceptions=True)
        with pytest.raises(EncoderUnavailable):
            await batcher.submit(rows(1.0))
        return outcomes

    outcomes = asyncio.run(scenario())
    assert np.allclose(outcomes[0], expected(1.0))  # the running batch finished
    assert all(isinstance(o, EncoderUnavailable) for o in outcomes[1:])


def test_two_streams_run_batches_in_parallel() -> None:
    async def scenario():
        runs: list = []
        batcher = make_batcher(runs, streams=2, delay_ms=0, session_delay=0.15, merge=False)
        await asyncio.gather(batcher.submit(rows(1.0)), batcher.submit(rows(2.0)))
        used = [s.batches for s in batcher.pool.streams]
        await batcher.close()
        return runs, used

    runs, used = asyncio.run(scenario())
    assert used == [1, 1]
    (_, _, start_a, end_a), (_, _, start_b, end_b) = runs
    assert start_a < end_b and start_b < end_a  # overlapping runs


def test_one_stream_queues_batches_and_merges_while_busy() -> None:
    async def scenario():
        runs: list = []
        batcher = make_batcher(runs, streams=1, delay_ms=0, session_delay=0.05)
        await asyncio.gather(*(batcher.submit(rows(float(i))) for i in range(9)))
        await batcher.close()
        return runs

    runs = asyncio.run(scenario())
    assert sum(r[0] for r in runs) >= 9 and len(runs) <= 3  # 9 requests, at most 3 batches


def test_observer_gets_per_stage_timings() -> None:
    class Observer:
        def __init__(self) -> None:
            self.calls: list = []

        def batch_done(self, tower: str, bucket: int, items: int, timings: dict[str, float]) -> None:
            self.calls.append((tower, bucket, items, timings))

    async def scenario(observer):
        runs: list = []
        batcher = make_batcher(runs, delay_ms=10, observer=observer)
        await asyncio.gather(*(batcher.submit(rows(v), preprocess_s=0.5) for v in (1.0, 2.0, 3.0)))
        await batcher.close()

    observer = Observer()
    asyncio.run(scenario(observer))
    [(tower, bucket, items, timings)] = observer.calls
    assert (tower, bucket, items) == ("text", 4, 3)
    assert set(timings) == {"queue", "preprocess", "inference", "post"}
    assert timings["preprocess"] == pytest.approx(1.5)
    assert all(v >= 0 for v in timings.values()) and timings["queue"] < 1
