"""`cnclip serve` and `cnclip worker` as processes of their own, for the tests that need a real server
beside other processes: one start-up (poll the ready path), one stop, output to a file.

The output goes to a file, never to a pipe: a pipe nobody reads while the server runs fills at 64 KiB of
access log and then stalls the server (a load test writes that much in seconds).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.kserve_server import free_port

CNCLIP = [sys.executable, "-c", "from cli.main import main; main()"]  # the `cnclip` program, this interpreter
STARTUP_S = 60.0
# How soon a running server must see what another process wrote (tests/system/test_many_processes.py).
FRESH_WITHIN_S = 2.0


class CliServer:
    """`cnclip <command>` in a subprocess on a loopback port; output goes to a file (never a full pipe)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, ready_path: str = "/readyz", startup_s: float = STARTUP_S) -> CliServer:
        """Start the command (again, after `stop`: the log is appended to) and wait until `ready_path`
        answers 200; RuntimeError with the output if it exits or is not ready within `startup_s`."""
        port = self.args[self.args.index("--port") + 1]
        self.url = f"http://127.0.0.1:{port}"
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [*CNCLIP, *self.args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.args[0]} exited with {self.process.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + ready_path, timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.args[0]} was not ready after {startup_s} s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def env_for(toy_model_dir: Path, data_dir: Path, **extra: str) -> dict[str, str]:
    """Environment for a `cnclip serve`/`worker` subprocess on the toy model (fp32, buckets 1, 4, 8), without
    the caller's CNCLIP_* variables; the catalog's default SQLite file under `data_dir`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNCLIP_")}
    env.update(
        CNCLIP_MODEL_DIR=str(toy_model_dir),
        CNCLIP_DATA_DIR=str(data_dir),
        CNCLIP_PROVIDER="cpu",
        CNCLIP_PRECISION="fp32",
        CNCLIP_BUCKETS="[1,4,8]",
        **extra,
    )
    return env


@contextmanager
def running_server(env: dict[str, str], log: Path | None = None, startup_s: float = STARTUP_S) -> Iterator[str]:
    """`cnclip serve` in its own process on a free loopback port; its base URL once it is ready, stopped on
    exit. Its output goes to `log` (a scratch file when None)."""
    with tempfile.TemporaryDirectory(prefix="cnclip-serve-") as scratch:
        args = ["serve", "--host", "127.0.0.1", "--port", str(free_port())]
        server = CliServer(args, env, log or Path(scratch) / "serve.log")
        try:
            yield server.start(startup_s=startup_s).url
        finally:
            server.stop()


def found_ids(base: str, collection: str = "photos") -> set[int]:
    """The ids a text search of `collection` on the server at `base` finds (k=200); empty before it exists."""
    response = httpx.post(base + "/v1/search/text", json={"query": "照片", "collection": collection, "k": 200})
    if response.status_code == 404:  # the collection does not exist yet
        return set()
    assert response.status_code == 200, response.text
    return {r["id"] for r in response.json()["results"]}


def seconds_until(base: str, condition: Callable[[set[int]], bool], what: str) -> float:
    """How long until the server's search answers `condition` (ids of "photos"); fails past FRESH_WITHIN_S."""
    started = time.monotonic()
    while not condition(found_ids(base)):
        waited = time.monotonic() - started
        assert waited < FRESH_WITHIN_S, f"{what}: not seen by the server after {waited:.1f} s"
        time.sleep(0.05)
    return time.monotonic() - started


@contextmanager
def searches_meanwhile(base: str, clients: int = 2) -> Iterator[list[tuple[int, int]]]:
    """Text searches of "photos" (k=5) from `clients` threads, 30 ms apart each, while the block runs: what a
    migration must not disturb. Yields the answers as (status, result count), appended as they come."""
    stop = threading.Event()
    answers: list[tuple[int, int]] = []

    def search_until_stopped() -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            while not stop.is_set():
                r = client.post("/v1/search/text", json={"query": "照片", "collection": "photos", "k": 5})
                answers.append((r.status_code, len(r.json().get("results", [])) if r.status_code == 200 else 0))
                time.sleep(0.03)

    threads = [threading.Thread(target=search_until_stopped) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield answers
    finally:
        stop.set()
        for thread in threads:
            thread.join()
