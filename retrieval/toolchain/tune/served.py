"""A configuration measured as `serve` runs it: a `cnclip worker` process of its own, over HTTP.

The worker is the same `LocalEncoder`, plan, batcher, preprocessing and HTTP stack (uvicorn, the
middleware, the /v2 routes) that `serve` answers with; what differs between two configurations is only
the tuning file its settings name. Requests are the load tools': one item each, every text a different
query (the query cache is off as well), photo-like JPEGs for the image tower (decoded by the server, as
an upload is), sent by the closed-loop client of retrieval/toolchain/http_load.py from this process.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from retrieval.config import RuntimeSettings
from retrieval.errors import ModelError
from retrieval.tokenizer import tokenize
from retrieval.toolchain.bench import image_payloads, text_payloads
from retrieval.toolchain.children import die_with_parent
from retrieval.toolchain.http_load import RequestMaker, binary_body, closed_loop, http_request, in_turn
from retrieval.toolchain.tune.memory import peak_rss_mb
from retrieval.triton_names import IMAGE_BYTES_MODEL, TEXT_MODEL

HOST = "127.0.0.1"
STARTUP_S = 600.0  # a large model on 2 cores warms every bucket before it is ready
WARMUP_S = 0.5  # unmeasured, before each window: the batcher's threads, the arenas
MIN_ANSWERS = 2  # per client in a window, or the window is measured again, longer
MAX_WINDOW_S = 60.0
_PORT_LINE = re.compile(rb"/v2 on http://[^:\s]+:(\d+)")
_PLAN_LINE = re.compile(r"\b(text|image) tower: .*\[([a-z ]+)\]$", re.M)  # retrieval/encoder.py's line
_PROGRAM = [sys.executable, "-c", "from cli.main import main; main()"]  # `cnclip`, this interpreter
CODE_ROOT = Path(__file__).resolve().parents[3]  # the folder holding `retrieval` and `cli`


@dataclass
class Worker:
    """A running `cnclip worker`: where it listens, its process (for its memory), its log."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def plan_sources(self) -> dict[str, str]:
        """Where each tower's plan came from, as its start-up line says (`text tower: … [tuning file]`)."""
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return dict(_PLAN_LINE.findall(text))

    def peak_rss_mb(self) -> float:
        """The worker's peak resident memory so far in MB (VmHWM; 0.0 where /proc has none)."""
        return peak_rss_mb(self.process.pid)


def worker_env(model_dir: Path, tuning_file: Path, data_dir: Path) -> dict[str, str]:
    """This process's environment with only the runtime's `CNCLIP_*` settings kept (provider, threads,
    buckets… as `serve` would read them; no API key, database or encoder address) and the model, the
    tuning file and no query cache set."""
    fields = set(RuntimeSettings.model_fields)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CNCLIP_") or k[len("CNCLIP_") :].split("__")[0].lower() in fields
    }
    env.update(
        CNCLIP_MODEL_DIR=str(model_dir),
        CNCLIP_TUNING_FILE=str(tuning_file),
        CNCLIP_QUERY_CACHE_SIZE="0",  # every request must reach the model
        CNCLIP_DATA_DIR=str(data_dir),
    )
    env.pop("CNCLIP_ENCODER", None)  # the worker runs the model itself
    # The worker runs this process's code, whatever folder it starts in (it starts in an empty one,
    # so that a `cli` or `retrieval` folder where the user stands cannot stand in for ours).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CODE_ROOT), env.get("PYTHONPATH")]))
    return env


@contextmanager
def running_worker(model_dir: Path, tuning_file: Path) -> Iterator[Worker]:
    """`cnclip worker` on a free loopback port with `tuning_file` (absent: the defaults), ready; stopped
    on exit. ModelError with its output if it exits or is not ready within STARTUP_S."""
    with tempfile.TemporaryDirectory(prefix="cnclip-tune-worker-") as folder:
        log_path = Path(folder) / "worker.log"
        # -v: the project's start-up lines (each tower's plan); --log-level warning: no access log.
        command = [*_PROGRAM, "-v", "worker", "--host", HOST, "--port", "0", "--log-level", "warning"]
        with log_path.open("wb") as log:  # a file, never a pipe: a pipe nobody reads fills and stalls it
            env = worker_env(model_dir, tuning_file, Path(folder))
            process = subprocess.Popen(
                command, env=env, cwd=folder, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
            )  # a tune killed outright (kill -9) takes its worker with it, not only one that unwinds
        try:
            yield Worker(_wait_ready(process, log_path), process, log_path)
        finally:
            _stop(process)


def _wait_ready(process: subprocess.Popen[bytes], log_path: Path) -> int:
    deadline = time.monotonic() + STARTUP_S
    port = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ModelError(f"the validation worker exited with status {process.returncode}:\n{_tail(log_path)}")
        if port is None and (found := _PORT_LINE.search(log_path.read_bytes())):
            port = int(found.group(1))
        if port is not None:
            try:
                if httpx.get(f"http://{HOST}:{port}/readyz", timeout=5).status_code == 200:
                    return port
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    raise ModelError(f"the validation worker was not ready after {STARTUP_S:.0f} s:\n{_tail(log_path)}")


def _tail(log_path: Path, lines: int = 20) -> str:
    return "\n".join(log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@dataclass(frozen=True)
class TowerLoad:
    """One tower's requests for one worker, built ahead (building them in the loop would take this
    process the cores the worker needs) and sent in turn across the whole validation."""

    tower: str
    next_request: RequestMaker


def tower_load(port: int, tower: str, context_length: int) -> TowerLoad:
    """Text: a different query per request (token ids at the full length, as the remote encoder sends
    them); image: photo-like JPEG files, decoded by the worker."""

    def infer(model: str, body_and_headers: tuple[bytes, dict[str, str]]) -> bytes:
        return http_request(HOST, port, f"/v2/models/{model}/infer", *body_and_headers)

    if tower == "text":
        ids = tokenize(text_payloads(), context_length)
        built = [infer(TEXT_MODEL, binary_body("text", "INT64", row[None], "text_features")) for row in ids]
    else:
        files = image_payloads()
        built = [
            infer(IMAGE_BYTES_MODEL, binary_body("image_bytes", "BYTES", np.array([[f]], np.object_), "image_features"))
            for f in files
        ]
    return TowerLoad(tower, in_turn(built))


def served_rate(worker: Worker, load: TowerLoad, concurrency: int, seconds: float) -> float:
    """Items/s of `concurrency` closed-loop clients over one window (every request one item), a longer
    window where this one held too few answers to count on (a slow model, a short `seconds`); a
    ModelError where the worker answered any request with an error."""
    window = seconds
    warmup = min(WARMUP_S, seconds)  # never longer than what it precedes: a short window asked for a quick check
    while True:
        cell = asyncio.run(closed_loop(HOST, worker.port, load.next_request, concurrency, window, warmup_s=warmup))
        if cell.errors:
            raise ModelError(f"the validation worker failed {len(cell.errors)} request(s), e.g. {cell.errors[0]}")
        if len(cell.latencies_us) >= MIN_ANSWERS * concurrency or window >= MAX_WINDOW_S:
            return cell.infer_per_s
        window = min(4 * window, MAX_WINDOW_S)
