"""A real Triton Inference Server for the tests and benchmarks: the `tritonserver` binary that the
`nvidia-pytriton` wheel ships (Triton 2.51, Python backend only, no onnxruntime backend).

    with RealTriton(repository) as triton:      # loopback ports, waits until ready
        client = tritonclient.http.InferenceServerClient(triton.url)

What the binary needs to start, all set up here:
- `LD_LIBRARY_PATH`: the wheel's `nvidia_pytriton.libs/` and the directory of this interpreter's
  `libpython3.X.so` (the Python backend's stub embeds it);
- a backend directory with the stub for this Python version next to `libtriton_python.so`
  (`python_backend_stubs/3.X/triton_python_backend_stub`); copied into a temporary folder, never
  written into site-packages;
- `PYTHONPATH`: this interpreter's import path, so that the stub can import numpy, Pillow and
  onnxruntime for the exported models.

`unavailable_reason()` says why a platform cannot run it (not x86_64/aarch64 Linux with glibc ≥ 2.35);
anywhere else a missing wheel is an error, not a skip: it is a dev dependency (`make install`).
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import httpx

STARTUP_TIMEOUT_S = 90.0


def unavailable_reason() -> str | None:
    """Why this platform cannot run the wheel's tritonserver, or None when it can."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"):
        return f"nvidia-pytriton's tritonserver runs on x86_64/aarch64 Linux, not {sys.platform}/{platform.machine()}"
    libc, version = platform.libc_ver()
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if libc != "glibc" or parts < (2, 35):
        return f"nvidia-pytriton's tritonserver needs glibc >= 2.35, this is {libc or 'another libc'} {version}"
    return None


def _pytriton_root() -> Path:
    try:
        import pytriton
    except ImportError as exc:
        raise RuntimeError(
            "the real Triton tests need the nvidia-pytriton wheel (a dev dependency): run `make install`"
        ) from exc
    return Path(pytriton.__file__).resolve().parent


def _libpython_dir() -> Path:
    """The directory of the libpython3.X.so the stub links against: this interpreter's if it has one."""
    name = f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0"
    candidates = [sysconfig.get_config_var("LIBDIR"), "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"]
    for directory in candidates:
        if directory and (Path(directory) / name).exists():
            return Path(directory)
    raise RuntimeError(f"no {name} found (Triton's Python backend stub embeds it); looked in {candidates}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RealTriton:
    """One `tritonserver` process on 127.0.0.1 serving `repository`.

    `explicit=True` starts it with `--model-control-mode explicit` (all models loaded at start), so
    that tests can unload and load models through the repository API.
    """

    def __init__(self, repository: Path, *, explicit: bool = False, log_path: Path | None = None) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self.repository = Path(repository)
        self.explicit = explicit
        self.root = _pytriton_root()
        self.workdir = Path(tempfile.mkdtemp(prefix="tritonserver-"))
        self.log_path = log_path or self.workdir / "tritonserver.log"
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self._backends = self._prepare_backends()

    def _prepare_backends(self) -> Path:
        backends = self.workdir / "backends"
        shutil.copytree(self.root / "tritonserver" / "backends", backends)
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = self.root / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.exists():
            raise RuntimeError(f"nvidia-pytriton has no Python backend stub for Python {version}")
        shutil.copy2(stub, backends / "python" / "triton_python_backend_stub")
        return backends

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CNCLIP_")}
        libs = [str(self.root.parent / "nvidia_pytriton.libs"), str(_libpython_dir())]
        if env.get("LD_LIBRARY_PATH"):
            libs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())
        env["PYTHONNOUSERSITE"] = "1"
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ inside the model repository
        return env

    def command(self) -> list[str]:
        command = [
            str(self.root / "tritonserver" / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            f"--backend-directory={self._backends}",
            "--http-address=127.0.0.1",
            f"--http-port={self.port}",
            "--allow-grpc=false",
            "--allow-metrics=false",
            "--exit-timeout-secs=5",
            "--log-info=true",
        ]
        if self.explicit:
            command += ["--model-control-mode=explicit", "--load-model=*"]
        return command

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> RealTriton:
        """Start (or, after `kill`/`stop`, restart on the same port) and wait until ready."""
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.command(), env=self.environment(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"http://{self.url}/v2/health/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"tritonserver was not ready after {timeout_s:g} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def children(self) -> list[int]:
        """Process ids of the server's Python backend stubs."""
        if self.process is None:
            return []
        try:
            text = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def stub_of(self, model: str) -> int:
        """The process id of the (first) Python backend stub that runs `model`."""
        for pid in self.children():
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(f"/{model}/".encode() in arg for arg in args):
                return pid
        raise LookupError(f"no stub process of model '{model}' under tritonserver {self.process}")

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
        """SIGKILL the server and its stubs at once (a crash, not a shutdown)."""
        if self.process is not None and self.process.poll() is None:
            regions = self._shm_regions()
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
            for region in regions:
                region.unlink(missing_ok=True)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # any stub the server left behind

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RealTriton:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
