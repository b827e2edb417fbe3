"""The deadline between a Ray cluster's batches (indexer/bulk/cluster/watchdog.py): a stalled cluster fails
the run instead of hanging it; the first batch may take as long as the actors need; errors arrive in the
caller's thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from indexer.bulk.cluster.watchdog import Stalled, with_deadline


def slow(delays: list[float], release: threading.Event | None = None) -> Iterator[int]:
    for number, delay in enumerate(delays):
        if release is not None and number == len(delays) - 1:
            release.wait(5)
        time.sleep(delay)
        yield number


def test_every_item_comes_through_in_order() -> None:
    assert list(with_deadline(slow([0.0, 0.01, 0.0]), stall_s=1.0)) == [0, 1, 2]


def test_the_first_item_may_take_longer_than_the_deadline() -> None:
    assert list(with_deadline(slow([0.3, 0.0]), stall_s=0.1)) == [0, 1]


def test_a_stall_after_the_first_item_raises_within_the_deadline() -> None:
    release = threading.Event()
    got = []
    started = time.perf_counter()
    with pytest.raises(Stalled, match="nothing came back from the cluster for 0 s"):
        for item in with_deadline(slow([0.0, 0.0], release), stall_s=0.2):
            got.append(item)
    assert got == [0] and time.perf_counter() - started < 2.0
    release.set()  # the puller thread ends


def test_an_error_of_the_source_is_raised_in_the_callers_thread() -> None:
    def failing() -> Iterator[int]:
        yield 1
        raise RuntimeError("node lost")

    with pytest.raises(RuntimeError, match="node lost"):
        list(with_deadline(failing(), stall_s=1.0))
