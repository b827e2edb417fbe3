"""benchmarks/bench_concurrency.py's measuring parts: the closed-loop client (retrieval/toolchain/http_load.py)
against a local HTTP server whose delays are known, and perf_analyzer's detection
(benchmarks/perf_analyzer_check.py) on fake programs: a 2 kB stub, a binary that cannot load, a wrapper
that answers, and PyPI's package installed without a program."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks import perf_analyzer_check
from benchmarks.bench_concurrency import Server, distinct_query, perf_analyzer_cell, sized_query, verdicts
from benchmarks.perf_analyzer_check import PerfAnalyzer, find_perf_analyzer, read_csv
from retrieval.text_lengths import used_lengths
from retrieval.tokenizer import tokenize
from retrieval.toolchain.http_load import closed_loop, http_request


class DelayedHandler(BaseHTTPRequestHandler):
    """POST /delay/<ms>[/<status>]: answers after sleeping <ms> milliseconds, with <status> (200)."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the servers the benchmark measures
    disable_nagle_algorithm = True  # else the body waits for the client's delayed ACK (~40 ms)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        _, _, ms, *status = self.path.split("/")
        time.sleep(int(ms) / 1000)
        body = b"x" * 100
        self.send_response(int(status[0]) if status else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def delayed_server() -> Iterator[tuple[str, int]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), DelayedHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_rate_and_percentiles_match_the_servers_known_delays(delayed_server: tuple[str, int]) -> None:
    host, port = delayed_server
    # Every 10th request takes 80 ms, the others 10 ms: p50 is 10 ms, p99 80 ms, and two clients back
    # to back spend 2 s per second at 17 ms a request on average: 2 / 0.017 ≈ 118 requests per second.
    seen: list[int] = []

    def make(i: int) -> bytes:
        seen.append(i)
        return http_request(host, port, f"/delay/{80 if i % 10 == 9 else 10}", b"{}")

    cell = asyncio.run(closed_loop(host, port, make, concurrency=2, duration_s=2.0, warmup_s=0.3))
    assert cell.errors == []
    assert len(seen) == len(set(seen))  # every request gets a number of its own: inputs can all differ
    expected = 2 / 0.017
    # Sleeps only add time, so the rate cannot beat the delays (+1 request per client at the window's edge);
    # a busy machine (other tests, 2 cores) may make it slower, not by more than half.
    assert 0.5 * expected <= cell.infer_per_s <= expected + 2 / 2.0
    # Little's law for a closed loop: two requests always in flight, so rate × mean latency ≈ 2, however busy.
    assert cell.infer_per_s * np.mean(cell.latencies_us) / 1e6 == pytest.approx(2, rel=0.1)
    assert 10_000 <= cell.percentile_us(50) < 80_000 <= cell.percentile_us(99) < 80_000 + 60_000


def test_answers_other_than_2xx_are_errors_not_throughput(delayed_server: tuple[str, int]) -> None:
    host, port = delayed_server
    cell = asyncio.run(
        closed_loop(host, port, lambda i: http_request(host, port, "/delay/5/503", b""), 1, 0.5, warmup_s=0.0)
    )
    assert cell.infer_per_s == 0 and cell.latencies_us == []
    assert cell.errors and set(cell.errors) == {"HTTP 503"}


def test_every_query_number_gives_other_token_ids() -> None:
    # The query cache keys on token ids: distinct ids for distinct numbers mean it can answer none of them.
    rows = tokenize([distinct_query(i) for i in range(3000)])
    assert len({row.tobytes() for row in rows}) == 3000
    assert all(len(distinct_query(i)) >= 5 for i in range(100))  # two characters at least, and "的照片"
    # --query-tokens 16: every query exactly 16 tokens long, still distinct.
    sized = tokenize([sized_query(i, 16) for i in range(3000)])
    assert set(used_lengths(sized).tolist()) == {16} and len({row.tobytes() for row in sized}) == 3000
    with pytest.raises(ValueError, match="more than 6"):
        sized_query(0, 6)


def fake_program(path: Path, script: str, size: int | None = None) -> str:
    text = script if size is None else script + "#" * (size - len(script.encode()) - 1) + "\n"
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def test_a_2kb_stub_is_detected_and_said_in_one_line(tmp_path: Path) -> None:
    stub = fake_program(
        tmp_path / "perf_analyzer",
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'perf_analyzer.bin'\" >&2\nexit 1\n",
        size=2048,
    )
    found = find_perf_analyzer(stub)
    assert not found.runs
    assert "2,048 B stub" in found.note and "\n" not in found.note


def test_a_binary_that_cannot_load_its_libraries_does_not_run(tmp_path: Path) -> None:
    glibc = fake_program(
        tmp_path / "perf_analyzer",
        "#!/bin/sh\necho 'perf_analyzer: /lib/x86_64-linux-gnu/libc.so.6: version GLIBC_2.38 not found' >&2\nexit 1\n",
        size=200_000,  # not small: not a stub, a program that does not run here
    )
    found = find_perf_analyzer(glibc)
    assert not found.runs and "does not run here" in found.note and "GLIBC_2.38" in found.note
    broken = tmp_path / "elf"
    broken.write_bytes(b"\x7fELF" + b"\0" * 60)
    broken.chmod(0o755)
    found = find_perf_analyzer(str(broken))
    assert not found.runs and "does not run" in found.note


def test_a_program_that_answers_like_perf_analyzer_is_used(tmp_path: Path) -> None:
    wrapper = fake_program(tmp_path / "perf_analyzer", '#!/bin/sh\necho "perf_analyzer 2.60.0"\n')
    found = find_perf_analyzer(wrapper)
    assert found.runs and found.note.endswith("perf_analyzer 2.60.0")


def test_the_pypi_package_without_a_program_is_named_with_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    files = [SimpleNamespace(size=32), SimpleNamespace(size=1510), SimpleNamespace(size=None)]
    package = SimpleNamespace(version="2.60.0", files=files)
    monkeypatch.setattr(perf_analyzer_check.shutil, "which", lambda name: None)
    monkeypatch.setattr(perf_analyzer_check.importlib.metadata, "distribution", lambda name: package)
    found = find_perf_analyzer()
    assert not found.runs and found.path is None
    assert "perf_analyzer 2.60.0 from PyPI is a 1,542 B stub" in found.note


def test_perf_analyzers_csv_row_of_the_concurrency_is_read(tmp_path: Path) -> None:
    csv = tmp_path / "pa.csv"
    csv.write_text(
        "Concurrency,Inferences/Second,Client Send,p50 latency,p90 latency,p95 latency,p99 latency,Avg latency\n"
        "1,57.2,10,17000,18000,19000,21000,17500\n"
        "8,112.4,12,70000,80000,85000,99000,71000\n"
    )
    result = read_csv(csv, 8)
    assert (result.infer_per_s, result.p50_us, result.p99_us) == (112.4, 70000.0, 99000.0)


def test_perf_analyzer_gets_the_model_and_inputs_a_client_of_that_server_sends(tmp_path: Path) -> None:
    # A stand-in that keeps its arguments and answers with a CSV row, as perf_analyzer's `-f` does.
    fake = fake_program(
        tmp_path / "perf_analyzer",
        f"#!{sys.executable}\n"
        "import sys\n"
        "args = sys.argv[1:]\n"
        f"open({str(tmp_path / 'args')!r}, 'w').write('\\n'.join(args))\n"
        "c = args[args.index('--concurrency-range') + 1].split(':')[0]\n"
        "open(args[args.index('-f') + 1], 'w').write(\n"
        "    'Concurrency,Inferences/Second,p50 latency,p99 latency\\n' + c + ',99.5,2000,9000\\n')\n",
    )
    tool = PerfAnalyzer(fake, True, "fake")
    triton = Server("triton", "127.0.0.1", 1, [16, 52])  # it has cnclip_text_l16: short queries go there
    result = perf_analyzer_cell(tool, triton, "text", [], [], 4, 1.5, tmp_path)
    assert result == (99.5, 2000.0, 9000.0)
    args = (tmp_path / "args").read_text().splitlines()
    assert args[args.index("-m") + 1] == "cnclip_text_l16" and args[args.index("-u") + 1] == "127.0.0.1:1"
    assert args[args.index("--concurrency-range") + 1] == "4:4"
    assert args[args.index("--measurement-interval") + 1] == "1500"
    entries = json.loads(Path(args[args.index("--input-data") + 1]).read_text())["data"]
    assert len(entries) == 2000 and {tuple(e["text"]["shape"]) for e in entries} == {(16,)}
    assert len({tuple(e["text"]["content"]) for e in entries}) == 2000  # distinct queries, not one repeated


def test_the_verdicts_name_falling_throughput_and_cells_below_triton() -> None:
    def runs(*rates: float) -> list[tuple[float, float, float]]:
        return [(r, 0.0, 0.0) for r in rates]

    results = {
        ("worker", "text", 1): runs(63, 60, 66),
        ("worker", "text", 8): runs(45, 44, 47),  # falls: the seed's finding
        ("triton", "text", 1): runs(57),
        ("triton", "text", 8): runs(112),
        ("worker", "image-bytes", 1): runs(20),
        ("worker", "image-bytes", 8): runs(19.5),  # within 5 %: noise, not a fall
        ("triton", "image-bytes", 1): runs(20),
        ("triton", "image-bytes", 8): runs(19),
    }
    falls, below = verdicts(results)
    assert falls == "throughput falls as concurrency rises: worker text c1→c8"
    assert below == "below Triton: worker text c8"


def test_tunes_window_too_short_for_a_slow_server_is_measured_again_longer(delayed_server: tuple[str, int]) -> None:
    """`cnclip tune`'s validation (retrieval/toolchain/tune/served.py): a 50 ms window cannot hold two
    answers of a server taking 200 ms each; it is measured again over a longer window, not read as 0/s."""
    from retrieval.toolchain.tune.served import TowerLoad, Worker, served_rate

    host, port = delayed_server
    load = TowerLoad("text", lambda i: http_request(host, port, "/delay/200", b"{}"))
    rate = served_rate(Worker(port, None, Path("unused")), load, 1, 0.05)  # type: ignore[arg-type]
    assert 2.5 <= rate <= 5.0 + 1 / 0.8  # one client at 200 ms a request: 5/s, less on a busy machine


def test_tunes_warm_up_is_never_longer_than_the_window_it_precedes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quick validation (`--validate-seconds 0.05`) spent 0.5 s warming before each 0.05 s window: 24
    windows, 12 s of a toy model's tune. The default window (2 s) still warms 0.5 s."""
    from retrieval.toolchain import http_load
    from retrieval.toolchain.tune import served

    warmups: list[float] = []

    async def answered(*_: object, warmup_s: float, **__: object) -> http_load.Cell:
        warmups.append(warmup_s)
        return http_load.Cell(concurrency=1, duration_s=1.0, latencies_us=[1000.0] * 8, errors=[])

    monkeypatch.setattr(served, "closed_loop", answered)
    load = served.TowerLoad("text", lambda i: b"")
    for seconds in (0.05, 2.0):
        served.served_rate(served.Worker(0, None, Path("unused")), load, 1, seconds)  # type: ignore[arg-type]
    assert warmups == [0.05, served.WARMUP_S]
