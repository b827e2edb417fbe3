"""Start the `tritonserver` of the nvidia-pytriton wheel on a repository from `cnclip export-triton`
(`cnclip triton-server`; the real-Triton tests start it the same way).

The wheel ships Triton 2.51 with only the Python backend. Its binary, run bare, loads no model; it
needs, all set up here:
- `LD_LIBRARY_PATH`: the wheel's `nvidia_pytriton.libs/` and the directory of this interpreter's
  `libpython3.X.so` (the Python backend's stub embeds it);
- a backend directory with the stub for this Python version next to `libtriton_python.so`
  (`python_backend_stubs/3.X/triton_python_backend_stub`), copied into a temporary folder (never
  written into site-packages) that is removed when the server stops;
- a `PATH` whose first `python3` is this interpreter. The stub's embedded Python ignores
  `PYTHONPATH` (and the other `PYTHON*` variables) and finds its prefix, so its site-packages, through
  the `python3` on `PATH`: a venv's python run by full path, with no venv activated, would otherwise
  give the models another Python's packages (or none: `No module named 'PIL'`). The venv's own `bin/`
  goes first, so that the embedded Python finds its `pyvenv.cfg` as `python` itself does.

What the wheel cannot serve is refused before starting: a model whose backend (`onnxruntime`,
`npu_ge`, …) is not in the wheel.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import importlib.util
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from retrieval.errors import CnclipError
from retrieval.toolchain import children
from retrieval.toolchain.triton.backends import TRITON_BACKENDS

WHEEL = "nvidia-pytriton==0.7.0"
PLATFORMS = "x86_64/aarch64 Linux with glibc >= 2.35"
EXIT_TIMEOUT_S = 10  # tritonserver's --exit-timeout-secs: how long in-flight requests may finish
STOP_GRACE_S = EXIT_TIMEOUT_S + 10  # then the server and its stubs are killed
# Why a backend the wheel lacks cannot run, and what to do instead.
MISSING_BACKEND_HINTS = {r.name: r.missing_hint for r in TRITON_BACKENDS.values() if r.missing_hint}
# Triton `platform` names → the backend that runs them (the rest name their backend directly).
_PLATFORM_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "pytorch_libtorch": "pytorch",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}
_BACKEND_UTILS = "triton_python_backend_utils"  # the stub provides it
_PIP_NAMES = {"PIL": "pillow"}  # import name → what to pip install, where they differ
_TOP_LEVEL_FIELD = re.compile(r'^(backend|platform)\s*:\s*"([^"]*)"', re.MULTILINE)


class TritonServerError(CnclipError):
    """The server cannot be started or stopped as asked; the message says why and what to do."""

    code = "triton_server_error"


def unavailable_reason() -> str | None:
    """Why this platform cannot run the wheel's tritonserver, or None when it can."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"):
        return f"nvidia-pytriton's tritonserver runs on {PLATFORMS}, not {sys.platform}/{platform.machine()}"
    libc, version = platform.libc_ver()
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if libc != "glibc" or parts < (2, 35):
        return f"nvidia-pytriton's tritonserver needs glibc >= 2.35, this is {libc or 'another libc'} {version}"
    return None


def wheel_root() -> Path:
    """The installed `pytriton` package folder (it holds `tritonserver/`), or an error saying what to install."""
    reason = unavailable_reason()
    if reason is not None:
        raise TritonServerError(reason)
    try:
        import pytriton
    except ImportError:
        raise TritonServerError(
            f"no tritonserver: it comes with the nvidia-pytriton wheel, `pip install {WHEEL}` ({PLATFORMS})"
        ) from None
    root = Path(pytriton.__file__).resolve().parent
    if not (root / "tritonserver" / "bin" / "tritonserver").is_file():
        raise TritonServerError(f"the nvidia-pytriton in {root} has no tritonserver binary; `pip install {WHEEL}`")
    return root


def wheel_backends(root: Path) -> set[str]:
    """The backends the wheel's Triton has (Python only, in 0.7.0)."""
    return {p.name for p in (root / "tritonserver" / "backends").iterdir() if p.is_dir() and p.name != "__pycache__"}


def repository_models(repository: Path, backends: set[str]) -> list[str]:
    """The models of `repository`, refused with a message when one needs a backend that is not in `backends`."""
    if not repository.is_dir():
        raise TritonServerError(f"{repository} is not a directory (make a repository with `cnclip export-triton`)")
    configs = sorted(repository.glob("*/config.pbtxt"))
    if not configs:
        raise TritonServerError(f"{repository} holds no models (no */config.pbtxt; see `cnclip export-triton`)")
    for config in configs:
        try:
            text = config.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TritonServerError(f"cannot read {config}: {exc}") from None
        fields = dict(_TOP_LEVEL_FIELD.findall(text))
        if fields.get("platform") == "ensemble":
            continue
        backend = fields.get("backend") or _PLATFORM_BACKENDS.get(fields.get("platform", ""), fields.get("platform"))
        if backend and backend not in backends:
            hint = MISSING_BACKEND_HINTS.get(
                backend, "serve it with NVIDIA's Triton image (nvcr.io/nvidia/tritonserver)"
            )
            raise TritonServerError(
                f"model '{config.parent.name}' uses the {backend} backend, which the tritonserver of nvidia-pytriton "
                f"does not have (it has: {', '.join(sorted(backends))}); {hint}"
            )
    return [c.parent.name for c in configs]


def missing_imports(repository: Path) -> list[tuple[str, str]]:
    """(model, module) for each package a Python model of `repository` imports that this interpreter
    cannot find: the stub runs this interpreter, so a missing Pillow is said here in one line, not
    as a traceback in Triton's log after every other model has loaded."""
    missing = []
    for source in sorted(repository.glob("*/[0-9]*/model.py")):
        try:
            tree = ast.parse(source.read_bytes(), filename=str(source))
        except (OSError, SyntaxError, ValueError):
            continue  # Triton reports a model it cannot load itself
        modules: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules.add(node.module.split(".")[0])
        for module in sorted(modules - set(sys.stdlib_module_names) - {_BACKEND_UTILS}):
            if importlib.util.find_spec(module) is None:
                missing.append((source.parent.parent.name, module))
    return missing


def libpython_dir() -> Path:
    """The directory of the libpython3.X.so the stub links against: this interpreter's if it has one."""
    name = f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0"
    candidates = [sysconfig.get_config_var("LIBDIR"), "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"]
    for directory in candidates:
        if directory and (Path(directory) / name).exists():
            return Path(directory)
    raise TritonServerError(
        f"no {name} found (Triton's Python backend stub embeds it; install Python's shared library, "
        f"e.g. the libpython{sys.version_info.major}.{sys.version_info.minor} package); looked in {candidates}"
    )


def interpreter_bin(workdir: Path) -> Path:
    """A directory whose `python3` is this interpreter, to go first on the server's PATH.

    In a venv, the venv's `bin/`: the stub's Python finds `pyvenv.cfg` beside the `python3` it runs,
    not through a link to it (so a copied interpreter, `venv --copies`, works too). Elsewhere, a
    folder in `workdir` with a `python3` link to this interpreter (Python finds its prefix through
    links), so that nothing else of the interpreter's directory comes first on the server's PATH.
    """
    venv_bin = Path(sys.prefix) / "bin"
    if sys.prefix != sys.base_prefix and (venv_bin / "python3").exists():
        return venv_bin
    folder = workdir / "bin"
    folder.mkdir(exist_ok=True)
    (folder / "python3").symlink_to(sys.executable)
    return folder


def _check_port_free(host: str, port: int, what: str) -> None:
    """Fail now, in one line, where tritonserver would fail after loading every model."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no conflict
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise TritonServerError(f"{what} port {port} on {host} is in use") from None
            raise TritonServerError(f"cannot listen on {host}:{port} ({what}): {exc.strerror or exc}") from None


@dataclass(frozen=True)
class TritonLaunch:
    """What to serve, and where. A port of 0 turns gRPC or metrics off (HTTP is always on)."""

    repository: Path
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 0
    extra_args: tuple[str, ...] = field(default_factory=tuple)  # handed to tritonserver after ours

    @property
    def probe_host(self) -> str:
        """Where this machine reaches the server (a wildcard address is reached on loopback)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else "::1" if self.host == "::" else self.host
        return f"[{host}]" if ":" in host else host

    @property
    def http_url(self) -> str:
        return f"http://{self.probe_host}:{self.http_port}"


class TritonServer:
    """One wheel `tritonserver` process: prepared in a temporary folder, started, probed, stopped.

    `start()` checks everything it can first (wheel, repository, ports) and raises TritonServerError
    with one line; `close()` stops the server and removes the temporary folder.
    """

    def __init__(self, launch: TritonLaunch) -> None:
        self.launch = launch
        self.process: subprocess.Popen[bytes] | None = None
        self.workdir: Path | None = None
        self.models: list[str] = []

    def _prepare(self) -> tuple[Path, Path]:
        root = wheel_root()
        self.models = repository_models(self.launch.repository, wheel_backends(root))
        missing = missing_imports(self.launch.repository)
        if missing:
            model, module = missing[0]
            raise TritonServerError(
                f"model '{model}' imports {module}, which this Python does not have: "
                f"`{sys.executable} -m pip install {_PIP_NAMES.get(module, module)}`"
            )
        ports = {"HTTP": self.launch.http_port, "gRPC": self.launch.grpc_port, "metrics": self.launch.metrics_port}
        used = [p for p in ports.values() if p]
        if len(set(used)) != len(used):
            raise TritonServerError(f"the HTTP, gRPC and metrics ports must differ, got {ports}")
        for what, port in ports.items():
            if port:
                _check_port_free(self.launch.host, port, what)
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = root / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.is_file():
            raise TritonServerError(f"nvidia-pytriton has no Python backend stub for Python {version}")
        lib_dirs = [root.parent / "nvidia_pytriton.libs", libpython_dir()]
        self.workdir = Path(tempfile.mkdtemp(prefix="cnclip-triton-"))
        backends = self.workdir / "backends"
        shutil.copytree(root / "tritonserver" / "backends", backends)
        shutil.copy2(stub, backends / "python" / "triton_python_backend_stub")
        self._env = self._environment(lib_dirs, interpreter_bin(self.workdir))
        return root / "tritonserver" / "bin" / "tritonserver", backends

    @staticmethod
    def _environment(lib_dirs: list[Path], python_bin: Path) -> dict[str, str]:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*map(str, lib_dirs), *filter(None, [env.get("LD_LIBRARY_PATH")])])
        env["PATH"] = os.pathsep.join([str(python_bin), *filter(None, [env.get("PATH")])])
        return env

    def command(self, binary: Path, backends: Path) -> list[str]:
        """The tritonserver command line (ours first, then `extra_args`)."""
        launch = self.launch
        command = [
            str(binary),
            f"--model-repository={launch.repository.resolve()}",
            f"--backend-directory={backends}",
            f"--http-address={launch.host}",
            f"--http-port={launch.http_port}",
            f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
        ]
        if launch.grpc_port:
            command += [f"--grpc-address={launch.host}", f"--grpc-port={launch.grpc_port}"]
        else:
            command.append("--allow-grpc=false")
        if launch.metrics_port:
            command += [f"--metrics-address={launch.host}", f"--metrics-port={launch.metrics_port}"]
        else:
            command.append("--allow-metrics=false")
        return command + list(launch.extra_args)

    def start(self, *, die_with_parent: bool = False) -> None:
        """Check, prepare and start the server (not yet ready: see `wait_ready`)."""
        try:
            binary, backends = self._prepare()
            self.process = subprocess.Popen(
                self.command(binary, backends),
                env=self._env,  # its log goes where ours goes
                start_new_session=True,  # its own process group: signals are forwarded, stubs killed with it
                preexec_fn=children.die_with_parent() if die_with_parent else None,  # no orphan keeps the ports
            )
        except BaseException:
            self.close()
            raise

    def wait_ready(self, timeout_s: float, *, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Poll `/v2/health/ready` until 200 (True); False when `give_up()` becomes true (a stop was asked).

        Raises TritonServerError when the server exits first or is not ready within `timeout_s`.
        """
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2) as client:
            while time.monotonic() < deadline:
                if give_up():
                    return False
                if self.process.poll() is not None:
                    raise TritonServerError(
                        f"tritonserver exited with status {self.process.returncode} before it was ready (see its log)"
                    )
                try:
                    if client.get(f"{self.launch.http_url}/v2/health/ready").status_code == 200:
                        return True
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise TritonServerError(f"tritonserver was not ready after {timeout_s:g} s")

    def send_signal(self, signum: int) -> None:
        """Send `signum` to the server (not to its stubs: the server stops them itself)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL the server and its stubs (its process group) at once."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self, signum: int = signal.SIGTERM, grace_s: float = STOP_GRACE_S) -> int | None:
        """Ask the server to stop, wait for it (SIGKILL after `grace_s`), reap it; its exit status or None if killed."""
        if self.process is None:
            return None
        self.send_signal(signum)
        try:
            status: int | None = self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            status = None
        self.kill()  # also any stub the server left behind
        return status

    def close(self) -> None:
        """Stop the server if it runs and remove the temporary backend folder."""
        if self.process is not None and self.process.poll() is None:
            self.stop()
        elif self.process is not None:
            self.kill()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> TritonServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
