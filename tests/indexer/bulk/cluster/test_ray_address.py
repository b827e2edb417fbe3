"""`--ray` at an address where nothing answers says so in one line, at once: `ray.init` alone retried a
dead `host:port` for minutes without a word (seen: over 120 s)."""

from __future__ import annotations

import socket
import time

import pytest

from indexer.bulk.cluster.ray_session import check_reachable
from retrieval.errors import InvalidInput


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again when the block ends: nothing listens there


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_nothing_listening_is_one_line_at_once(scheme: str) -> None:
    address = f"{scheme}127.0.0.1:{closed_port()}"
    started = time.monotonic()
    with pytest.raises(InvalidInput, match="nothing answers there"):
        check_reachable(address)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("address", ["127.0.0.1:0", "127.0.0.1:99999", "127.0.0.1:x"])
def test_a_port_out_of_range_is_refused(address: str) -> None:
    with pytest.raises(InvalidInput, match="port must be 1-65535"):
        check_reachable(address)


def test_a_listening_address_and_auto_pass() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")
    check_reachable("auto")
