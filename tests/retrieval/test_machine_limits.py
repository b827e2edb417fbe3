"""The core gate: never more compute threads at work than cores, first come first served; and the
runnable-thread count read from /proc."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from retrieval.machine_limits import CoreGate, runnable_threads


def test_gate_never_lets_more_threads_work_than_its_cores() -> None:
    gate = CoreGate(3)
    working = 0
    most = 0
    lock = threading.Lock()

    def work(threads: int) -> None:
        nonlocal working, most
        for _ in range(5):
            with gate.hold(threads):
                with lock:
                    working += threads
                    most = max(most, working)
                time.sleep(0.002)
                with lock:
                    working -= threads

    workers = [threading.Thread(target=work, args=(1 + i % 3,)) for i in range(9)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(10)
    assert most <= 3 and gate.peak <= 3
    assert gate.held == 0  # every permit came back


def test_a_wide_run_is_served_before_narrow_ones_that_came_later() -> None:
    """A 2-thread batch waiting for both cores is not overtaken by a flow of 1-thread decodes."""
    gate = CoreGate(2)
    order: list[str] = []
    first = gate.hold(1)
    first.__enter__()  # one core busy: the wide run must wait

    def take(name: str, threads: int) -> None:
        with gate.hold(threads):
            order.append(name)

    wide = threading.Thread(target=take, args=("wide", 2))
    wide.start()
    time.sleep(0.05)  # the wide run is in line first
    narrow = threading.Thread(target=take, args=("narrow", 1))
    narrow.start()
    time.sleep(0.05)
    assert order == []  # one core is free, but the narrow run is behind the wide one
    first.__exit__(None, None, None)
    wide.join(5)
    narrow.join(5)
    assert order == ["wide", "narrow"]


@pytest.mark.parametrize("asked", [0, 5])
def test_zero_threads_take_nothing_and_more_than_the_cores_take_them_all(asked: int) -> None:
    gate = CoreGate(2)
    with gate.hold(asked):
        assert gate.held == min(asked, 2)
    assert gate.held == 0


def test_runnable_threads_sees_a_busy_thread_and_not_a_sleeping_one() -> None:
    stop = threading.Event()
    ids: list[int] = []

    def spin() -> None:
        ids.append(threading.get_native_id())
        while not stop.is_set():
            pass

    def sleep() -> None:
        ids.append(threading.get_native_id())
        stop.wait()

    def all_but(thread_id: int) -> set[int]:  # look at one thread: other tests' threads may be busy
        return {int(task.name) for task in Path("/proc/self/task").iterdir()} - {thread_id}

    sleeper = threading.Thread(target=sleep)
    sleeper.start()
    time.sleep(0.05)
    assert runnable_threads(exclude=all_but(ids[0])) == 0
    spinner = threading.Thread(target=spin)
    spinner.start()
    time.sleep(0.05)
    deadline = time.perf_counter() + 5
    seen = 0
    while time.perf_counter() < deadline and not seen:
        seen = runnable_threads(exclude=all_but(ids[1]))
    stop.set()
    spinner.join()
    sleeper.join()
    assert seen >= 1


def _waiting(gate: CoreGate, name: str, threads: int, order: list[str], urgent: bool = False) -> threading.Thread:
    def take() -> None:
        with gate.hold(threads, urgent):
            order.append(name)

    thread = threading.Thread(target=take)
    thread.start()
    time.sleep(0.02)  # in line before the next one
    return thread


def test_a_text_query_goes_before_queued_decodes_and_image_batches() -> None:
    gate = CoreGate(2, overtake_s=5.0)
    order: list[str] = []
    busy = gate.hold(2)
    busy.__enter__()
    waiting = [
        _waiting(gate, "decode", 1, order),
        _waiting(gate, "image batch", 2, order),
        _waiting(gate, "query", 2, order, urgent=True),
    ]
    busy.__exit__(None, None, None)
    for thread in waiting:
        thread.join(5)
    assert order == ["query", "decode", "image batch"]


def test_queries_overtake_only_until_the_oldest_other_waiter_has_waited_overtake_s() -> None:
    gate = CoreGate(1, overtake_s=0.05)
    order: list[str] = []
    busy = gate.hold(1)
    busy.__enter__()
    decode = _waiting(gate, "decode", 1, order)
    time.sleep(0.1)  # the decode has waited past overtake_s
    query = _waiting(gate, "query", 1, order, urgent=True)
    busy.__exit__(None, None, None)
    decode.join(5)
    query.join(5)
    assert order == ["decode", "query"]
