"""Issue 21: no small request may stall the server. Against a real uvicorn server (tests/support/live_server.py)
with the real toy-model encoder and an API key: small hostile bodies (a gzip bomb of a huge JSON list, a
1×50,000,000 px PNG, 200k unknown JSON keys, an endless chunked body on a GET) are sent in parallel while
`/healthz` is timed and the server's RSS is read. Each gets a clean 4xx in its prefix's error shape,
`/healthz` stays fast, memory stays put, the endless body is cut off, and a request without the key is
refused before its body is read."""

from __future__ import annotations

import gc
import http.client
import io
import json
import select
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from pydantic import SecretStr

from api.app import create_app
from api.config import Settings
from tests.support.crafted_images import png_chunk
from tests.support.live_server import LiveServer

KEY = "s3cret-key"
HEALTHZ_MAX_S = 0.100  # the bound on every /healthz answer while the hostile requests run
RSS_GROWTH_MAX_MB = 100  # the server's VmRSS after the hostile requests, over its VmRSS before them
BODY_TIMEOUT_S = 2.0


def _gzip_chunks(parts: Iterator[bytes]) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return b"".join(packer.compress(p) for p in parts) + packer.flush()


def gzip_bomb_rows(rows: int = 15_000_000) -> bytes:
    """A KServe v2 request whose `data` is `rows` tiny rows `[0]`: ~60 MB of JSON, ~60 KB gzipped."""
    head = b'{"inputs":[{"name":"text","shape":[1,52],"datatype":"INT64","data":['
    block = b"[0]," * 250_000

    def parts() -> Iterator[bytes]:
        yield head
        for _ in range(rows // 250_000 - 1):
            yield block
        yield b"[0]," * 249_999 + b"[0]]}]}"

    return _gzip_chunks(parts())


def gzip_flat_zeros(count: int = 32_000_000) -> bytes:
    """A flat JSON list of `count` zeros (64 MB), gzipped."""
    block = b"0," * 1_000_000

    def parts() -> Iterator[bytes]:
        yield b"["
        for _ in range(count // 1_000_000 - 1):
            yield block
        yield b"0," * 999_999 + b"0]"

    return _gzip_chunks(parts())


def huge_png(width: int, height: int) -> bytes:
    """A valid 8-bit greyscale PNG of width×height zero pixels (tiny when compressed)."""
    row = b"\x00" * (1 + width)  # filter byte + pixels
    rows_per_part = max(1, 1_000_000 // len(row))
    packer = zlib.compressobj(9)
    idat = [packer.compress(row * rows_per_part) for _ in range(height // rows_per_part)]
    idat.append(packer.compress(row * (height % rows_per_part)) + packer.flush())

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", b"".join(idat)) + png_chunk(b"IEND", b"")
    )


def many_keys(n: int = 200_000) -> bytes:
    return json.dumps({"query": "猫", **{f"k{i}": 0 for i in range(n)}}).encode()


def multipart(field: str, filename: str, data: bytes) -> tuple[bytes, str]:
    boundary = "cnclip-test-boundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
            f"Content-Type: image/png\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


def vm_rss_mb() -> float:
    """This process's resident memory (the live server runs in it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.fixture(scope="module")
def payloads() -> dict[str, bytes]:
    """Built once, before any server runs (building them is the client's work, not the server's)."""
    bomb, zeros, png = gzip_bomb_rows(), gzip_flat_zeros(), huge_png(1, 50_000_000)
    assert len(bomb) < 100_000 and len(zeros) < 200_000 and len(png) < 120_000  # small, as in the issue
    return {"bomb": bomb, "zeros": zeros, "png": png, "keys": many_keys()}


@pytest.fixture
def keyed(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"api_key": SecretStr(KEY), "body_read_timeout_s": BODY_TIMEOUT_S, "buckets": [1, 4]}
    )


def _request(server: LiveServer, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def _hostile_requests(payloads: dict[str, bytes]) -> dict[str, tuple[str, str, bytes, dict[str, str]]]:
    png_body, png_type = multipart("file", "tall.png", payloads["png"])
    gz = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    return {
        "gzip bomb of 15M rows": ("POST", "/v2/models/cnclip_text/infer", payloads["bomb"], gz),
        "32M zeros to the repository index": ("POST", "/v2/repository/index", payloads["zeros"], gz),
        "1×50,000,000 px PNG": ("POST", "/v1/search/image", png_body, {"Content-Type": png_type}),
        "200k unknown keys": ("POST", "/v1/search/text", payloads["keys"], {"Content-Type": "application/json"}),
    }


def _endless_chunked_get(server: LiveServer, seconds: float) -> float | None:
    """GET /healthz with a chunked body that never ends; seconds until the server closed it (None: never)."""
    sock = socket.create_connection((server.host, server.port), timeout=0.5)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    started = time.monotonic()
    chunk = b"1000\r\n" + b"x" * 4096 + b"\r\n"
    try:
        while time.monotonic() - started < seconds:
            try:
                sock.sendall(chunk)
            except TimeoutError:
                pass  # the server stopped reading: not closed yet (a close shows as EOF or a reset)
            except (ConnectionResetError, BrokenPipeError):
                return time.monotonic() - started
            readable, _, _ = select.select([sock], [], [], 0)
            try:
                if readable and sock.recv(65536) == b"":  # EOF: the server closed it (the 200 came earlier)
                    return time.monotonic() - started
            except ConnectionResetError:
                return time.monotonic() - started
            time.sleep(0.01)
        return None
    finally:
        sock.close()


def _time_healthz(server: LiveServer, stop: threading.Event, latencies: list[float]) -> None:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    while not stop.is_set():
        started = time.perf_counter()
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        response.read()
        latencies.append(time.perf_counter() - started)
        assert response.status == 200
        time.sleep(0.01)
    conn.close()


def _in_threads(jobs: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    results: dict[str, Any] = {}

    def run(name: str, job: Callable[[], Any]) -> None:
        try:
            results[name] = job()
        except Exception as exc:  # reported by the assertion below, with its name
            results[name] = exc

    threads = [threading.Thread(target=run, args=item) for item in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def test_hostile_bodies_in_parallel_get_4xx_while_healthz_stays_fast_and_memory_stays(
    keyed: Settings, payloads: dict[str, bytes]
) -> None:
    hostile = _hostile_requests(payloads)
    with LiveServer(create_app(keyed)) as server:
        for method, path, body, headers in hostile.values():  # warm-up: first-call imports and allocations
            _request(server, method, path, body, headers)
        gc.collect()
        before = vm_rss_mb()
        stop, latencies = threading.Event(), []
        timer = threading.Thread(target=_time_healthz, args=(server, stop, latencies))
        timer.start()
        try:
            jobs: dict[str, Callable[[], Any]] = {
                f"{name} #{i}": (lambda r=request: _request(server, *r))
                for name, request in hostile.items()
                for i in range(3)
            }
            jobs["endless chunked GET /healthz"] = lambda: _endless_chunked_get(server, 20)
            results = _in_threads(jobs)
        finally:
            stop.set()
            timer.join(timeout=30)
        gc.collect()
        grown = vm_rss_mb() - before

    for name, result in results.items():
        if name.startswith("endless"):
            # Closed by the whole-body deadline (+1 s of grace, api/slow_clients.py), not left open for ever.
            assert result is not None and BODY_TIMEOUT_S <= result < BODY_TIMEOUT_S + 3, f"{name}: {result}"
            continue
        assert not isinstance(result, Exception), f"{name}: {result!r}"
        status, body = result
        assert status in (400, 413, 422), f"{name}: {status} {body}"
        if name.startswith(("gzip", "32M")):  # /v2: Triton's shape
            assert isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str), body
        else:  # /v1: the project's shape
            assert set(body["error"]) == {"code", "message"}, body
    assert len(latencies) > 20, len(latencies)
    assert max(latencies) < HEALTHZ_MAX_S, f"/healthz took up to {max(latencies) * 1000:.0f} ms"
    assert grown < RSS_GROWTH_MAX_MB, f"RSS grew by {grown:.0f} MB"


def test_memory_of_large_legal_images_is_given_back(keyed: Settings) -> None:
    """Four 49 MP PNGs embedded at once: each decode is 147 MB, and none of it may stay behind
    (without retrieval/memory.py the server kept ~390 MB of freed buffers for good)."""
    buf = io.BytesIO()
    Image.new("RGB", (7000, 7000), (10, 200, 30)).save(buf, "PNG")
    body, content_type = multipart("file", "big.png", buf.getvalue())
    headers = {"Content-Type": content_type}
    with LiveServer(create_app(keyed)) as server:
        assert _request(server, "POST", "/v1/embed/image", body, headers)[0] == 200  # warm-up
        gc.collect()
        before = vm_rss_mb()
        results = _in_threads(
            {f"#{i}": lambda: _request(server, "POST", "/v1/embed/image", body, headers) for i in range(4)}
        )
        assert all(not isinstance(r, Exception) and r[0] == 200 for r in results.values()), results
        gc.collect()
        grown = vm_rss_mb() - before
    assert grown < RSS_GROWTH_MAX_MB, f"RSS grew by {grown:.0f} MB"


@pytest.mark.parametrize(
    ("reads_need_key", "head"),
    [
        (False, b"POST /v1/collections/photos/texts HTTP/1.1\r\nContent-Type: application/json\r\n"),
        (True, b"POST /v1/search/text HTTP/1.1\r\nContent-Type: application/json\r\n"),
        (True, b"POST /v1/search/image HTTP/1.1\r\nContent-Type: multipart/form-data; boundary=b\r\n"),
        (True, b"POST /v2/models/cnclip_text/infer HTTP/1.1\r\nContent-Encoding: gzip\r\n"),
    ],
)
def test_a_request_without_the_key_is_refused_before_its_body_arrives(
    keyed: Settings, reads_need_key: bool, head: bytes
) -> None:
    """No key: 401 at once, not after the body (which never comes) has timed out or been parsed."""
    app = create_app(keyed.model_copy(update={"require_key_for_reads": reads_need_key}))
    with LiveServer(app) as server:
        sock = socket.create_connection((server.host, server.port), timeout=10)
        sock.sendall(head + b"Host: x\r\nContent-Length: 10000000\r\n\r\n" + b"{" * 1000)
        started = time.monotonic()
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = json.loads(response.read())
        elapsed = time.monotonic() - started
        sock.close()
    assert response.status == 401, body
    if b" /v2/" in head:  # Triton's shape
        assert set(body) == {"error"} and "API key" in body["error"], body
    else:
        assert body["error"]["code"] == "unauthorized", body
    assert elapsed < BODY_TIMEOUT_S / 2, elapsed
