"""A real Triton Inference Server for the tests and benchmarks, started the way docs/triton.md starts it:
`cnclip triton-server REPO --http-port N --grpc-port 0` (retrieval/toolchain/triton/server.py) in a subprocess, so
that the documented path is the tested path. The server is the `tritonserver` binary of the
`nvidia-pytriton` wheel (Triton 2.51, Python backend only, no onnxruntime backend).

    with RealTriton(repository) as triton:      # a loopback port, waits until ready
        client = tritonclient.http.InferenceServerClient(triton.url)

This file knows no recipe of its own (libraries, stub, PATH): those are the product's. It only finds
the processes under the launcher, for tests that stall a stub or crash the server.

`unavailable_reason()` says why a platform cannot run it (not x86_64/aarch64 Linux with glibc ≥ 2.35);
anywhere else a missing wheel is an error, not a skip: it is a dev dependency (`make install`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from retrieval.toolchain.triton.server import unavailable_reason
from tests.support.cli_server import CNCLIP
from tests.support.kserve_server import free_port

__all__ = ["RealTriton", "unavailable_reason"]

STARTUP_TIMEOUT_S = 90.0


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class RealTriton:
    """`cnclip triton-server` serving `repository` on 127.0.0.1 (HTTP only).

    `explicit=True` adds `-- --model-control-mode=explicit --load-model=*` (all models loaded at
    start), so that tests can unload and load models through the repository API.
    """

    def __init__(
        self,
        repository: Path,
        *,
        explicit: bool = False,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self.repository = Path(repository)
        self.explicit = explicit
        self.workdir = Path(tempfile.mkdtemp(prefix="real-triton-"))
        self.log_path = log_path or self.workdir / "triton-server.log"
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.env = env if env is not None else {k: v for k, v in os.environ.items() if not k.startswith("CNCLIP_")}
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        tritonserver_args = ["--exit-timeout-secs=5", "--log-info=true"]
        if self.explicit:
            tritonserver_args += ["--model-control-mode=explicit", "--load-model=*"]
        return [
            *CNCLIP,
            "triton-server",
            str(self.repository),
            "--http-port",
            str(self.port),
            "--grpc-port",
            "0",
            "--ready-timeout",
            f"{STARTUP_TIMEOUT_S:g}",
            "--",
            *tritonserver_args,
        ]

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> RealTriton:
        """Start (or, after `kill`/`stop`, restart on the same port) and wait until ready."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(), env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"cnclip triton-server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"http://{self.url}/v2/health/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"cnclip triton-server was not ready after {timeout_s:g} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def server_pid(self) -> int | None:
        """The tritonserver process under the launcher."""
        if self.process is None:
            return None
        children = _children(self.process.pid)
        return children[0] if children else None

    def children(self) -> list[int]:
        """Process ids of the server's Python backend stubs."""
        server = self.server_pid()
        return [] if server is None else _children(server)

    def stub_of(self, model: str) -> int:
        """The process id of the (first) Python backend stub that runs `model`."""
        for pid in self.children():
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(f"/{model}/".encode() in arg for arg in args):
                return pid
        raise LookupError(f"no stub process of model '{model}' under tritonserver {self.server_pid()}")

    def _shm_regions(self) -> list[Path]:
        """The /dev/shm files of the stubs (named on their command lines); a killed server leaves them."""
        regions = []
        for pid in self.children():
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            regions += [Path("/dev/shm") / a.decode() for a in args if a.startswith(b"triton_python_backend_shm")]
        return regions

    def kill(self) -> None:
        """SIGKILL the server and its stubs at once (a crash, not a shutdown); the launcher then exits 1."""
        if self.process is None or self.process.poll() is not None:
            return
        regions, server = self._shm_regions(), self.server_pid()
        if server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server, signal.SIGKILL)  # the launcher gives tritonserver a process group of its own
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        for region in regions:
            region.unlink(missing_ok=True)

    def stop(self) -> None:
        """SIGTERM the launcher, as a service manager stops it (it forwards the signal and reaps the server)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.kill()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RealTriton:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
