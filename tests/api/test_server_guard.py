"""Against a real uvicorn server: a 500 keeps the kept-alive connection usable and logs one
traceback; slow request heads are cut off; a trickled body gets 408; oversized heads get 400."""

from __future__ import annotations

import http.client
import logging
import socket
import time
from collections.abc import Sequence

import numpy as np
import pytest

from api.app import create_app
from api.config import Settings
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import open_test_catalog
from tests.support.live_server import LiveServer


class _BuggyEncoder(FakeEncoder):
    async def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        raise RuntimeError("/secret/path: a bug")


def test_a_500_keeps_the_connection_and_logs_one_traceback(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    catalog = open_test_catalog(settings)
    app = create_app(settings, encoder=_BuggyEncoder(), catalog=catalog)
    try:
        with LiveServer(app) as server, caplog.at_level(logging.ERROR):
            conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
            statuses = []
            for _ in range(10):
                conn.request(
                    "POST", "/v1/embed/text", body=b'{"texts": ["x"]}', headers={"content-type": "application/json"}
                )
                r = conn.getresponse()
                body = r.read()
                statuses.append(r.status)
                assert b"secret" not in body and r.getheader("x-request-id", "") in body.decode()
                conn.request("GET", "/healthz")  # the same connection, right after the 500
                ok = conn.getresponse()
                ok.read()
                statuses.append(ok.status)
            conn.close()
    finally:
        catalog.close()
    assert statuses == [500, 200] * 10
    tracebacks = [rec for rec in caplog.records if rec.exc_info]
    assert len(tracebacks) == 10, [rec.getMessage() for rec in tracebacks]


def test_slow_heads_are_closed_and_slow_bodies_get_408(settings: Settings) -> None:
    quick = settings.model_copy(update={"body_read_timeout_s": 0.5})
    catalog = open_test_catalog(quick)
    app = create_app(quick, encoder=FakeEncoder(), catalog=catalog)
    try:
        with LiveServer(app, header_timeout_s=0.5) as server:
            # Half a request head, then nothing: closed after the header timeout.
            head = socket.create_connection((server.host, server.port), timeout=5)
            head.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            started = time.monotonic()
            assert head.recv(1024) == b""  # closed by the server
            assert time.monotonic() - started < 3
            head.close()
            # A whole head, half a body: 408 after the body deadline, and the connection is closed.
            body = socket.create_connection((server.host, server.port), timeout=5)
            body.sendall(
                b"POST /v1/embed/text HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"texts"'
            )
            started = time.monotonic()
            answer = b""
            while chunk := body.recv(4096):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
            assert b'"request_timeout"' in answer
            assert time.monotonic() - started < 3
            body.close()
            # A head over the cap: 400 and closed, never parsed into memory without bound.
            big = socket.create_connection((server.host, server.port), timeout=5)
            big.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 70_000 + b"\r\n\r\n")
            assert big.recv(1024).startswith(b"HTTP/1.1 400")
            big.close()
            # The server still answers at once.
            conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 200
            conn.close()
    finally:
        catalog.close()
