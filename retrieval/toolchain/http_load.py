"""A bounded, closed-loop HTTP load client: what `perf_analyzer --concurrency-range N` does, in Python,
for machines where perf_analyzer does not run (benchmarks/perf_analyzer_check.py says when), and what
`cnclip tune` validates its choice with (retrieval/toolchain/tune/served.py).

`concurrency` clients each hold one keep-alive connection and send their next request the moment
the previous one is answered, so at most `concurrency` requests are ever in flight (a closed loop:
the offered load follows the server, nothing queues up client-side). The clients start together,
run `warmup_s` unmeasured and then one window of `duration_s`, like one perf_analyzer time window:
a request counts when it is answered inside the window, `infer_per_s` is those answers over the
window, and the latency percentiles are theirs.

The HTTP is the bare minimum over asyncio streams (requests prebuilt as bytes by the caller, answers
read by Content-Length or chunked) rather than httpx: on 2 cores the client shares the CPU with the
server it measures, and httpx's per-request cost would be part of every number.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tritonclient.http as triton_http

RequestMaker = Callable[[int], bytes]  # request number (unique in a run) -> one whole HTTP request


@dataclass
class Cell:
    """What one closed-loop window measured."""

    concurrency: int
    duration_s: float
    latencies_us: list[float] = field(default_factory=list)  # of the answers (2xx) inside the window
    errors: list[str] = field(default_factory=list)  # non-2xx answers and transport errors, inside or not

    @property
    def infer_per_s(self) -> float:
        """Answered requests per second of the window (each request is one item: batch 1)."""
        return len(self.latencies_us) / self.duration_s

    def percentile_us(self, q: float) -> float:
        return float(np.percentile(self.latencies_us, q)) if self.latencies_us else float("nan")


def http_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """One POST as bytes, ready to write on a keep-alive connection."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def binary_body(name: str, datatype: str, data: np.ndarray, output: str) -> tuple[bytes, dict[str, str]]:
    """A v2 request body with binary tensors (what perf_analyzer and tritonclient send) and its headers."""
    tensor = triton_http.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=True)
    wanted = [triton_http.InferRequestedOutput(output, binary_data=True)]
    body, json_size = triton_http.InferenceServerClient.generate_request_body([tensor], outputs=wanted)
    return body, {"Inference-Header-Content-Length": str(json_size), "Content-Type": "application/octet-stream"}


def in_turn(requests: list[bytes]) -> RequestMaker:
    """The requests one after another across the whole run (not from the first again in every cell):
    a query cache of fewer entries than there are requests (an LRU) can then answer none of them."""
    turn = itertools.count()
    return lambda _i: requests[next(turn) % len(requests)]


async def _read_response(reader: asyncio.StreamReader) -> int:
    """Read one whole response; its status code."""
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the server closed the connection")
    status = int(status_line.split()[1])
    length, chunked = 0, False
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
        elif name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if not chunked:
        await reader.readexactly(length)
        return status
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        await reader.readexactly(size + 2)  # the chunk and its CRLF
        if size == 0:
            return status


async def closed_loop(
    host: str, port: int, make_request: RequestMaker, concurrency: int, duration_s: float, warmup_s: float = 1.0
) -> Cell:
    """`concurrency` clients back to back for `warmup_s` + `duration_s`; the window's answers measured.

    `make_request(i)` is called with a number unique within this call (0, 1, 2, ...), so the caller
    can make every request's input different (a query cache then cannot answer any of them)."""
    cell = Cell(concurrency, duration_s)
    counter = iter(range(1 << 62))
    start = time.perf_counter()
    window_start, window_end = start + warmup_s, start + warmup_s + duration_s

    async def client() -> None:
        reader, writer = await asyncio.open_connection(host, port)  # asyncio sets TCP_NODELAY
        try:
            while time.perf_counter() < window_end:
                request = make_request(next(counter))
                sent = time.perf_counter()
                try:
                    writer.write(request)
                    await writer.drain()
                    status = await _read_response(reader)
                except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
                    cell.errors.append(f"{type(exc).__name__}: {exc}")
                    return  # a broken connection: this client stops, the others go on
                answered = time.perf_counter()
                if not 200 <= status < 300:
                    cell.errors.append(f"HTTP {status}")
                elif window_start <= answered <= window_end:
                    cell.latencies_us.append((answered - sent) * 1e6)
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return cell
