"""A real Milvus server for the tests and benchmarks: the standalone server process that the PyPI
package `milvus` ("Embedded Milvus", 2.3.5) ships, not Milvus Lite's reimplementation.

    with RealMilvus() as server:      # a temporary base dir, free loopback ports, waits until healthy
        MilvusClient(uri=server.uri)

What it needs to run two at once (two test runs, a benchmark beside a test run), all set up here:
- every port the package configures (proxy, coordinators, nodes, the etcd client port) set to a free
  port instead of the package's fixed defaults (19530, 2379, ...), and the metrics/health port too;
- the embedded etcd's *peer* port, which the package does not configure (the embedded etcd then
  listens on 2379 and 2380 whatever the client endpoint says): an etcd config file names both URLs,
  and a copy of the package's config template points `etcd.config.path` at it.

`unavailable_reason()` says why a platform cannot run it (the wheel carries x86_64 Linux binaries
only); anywhere else a missing package is an error, not a skip: it is a dev dependency (`make install`).
"""

from __future__ import annotations

import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

STOP_TIMEOUT_S = 3.0


def unavailable_reason() -> str | None:
    """Why this platform cannot run the `milvus` wheel's server, or None when it can."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"the milvus 2.3.5 wheel ships an x86_64 Linux server, not {sys.platform}/{platform.machine()}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _milvus_package() -> Any:
    try:
        import milvus
    except ImportError as exc:
        raise RuntimeError(
            "the Milvus server tests need the `milvus` package (a dev dependency): run `make install`"
        ) from exc
    return milvus


class RealMilvus:
    """One `milvus run standalone` process on loopback ports in a temporary base dir."""

    def __init__(self, base_dir: Path | None = None) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self.package = _milvus_package()
        self.version = str(self.package.__version__)
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="milvus-server-"))
        self.server: Any = None
        self.port = 0

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config(self) -> Any:
        """The package's config with free ports and an etcd that listens on free ports too."""
        client_port, peer_port = free_port(), free_port()
        configs = self.base_dir / "configs"
        configs.mkdir(parents=True, exist_ok=True)
        etcd = configs / "etcd.yaml"
        etcd.write_text(
            f"name: cnclip-test\n"
            f"listen-client-urls: http://127.0.0.1:{client_port}\n"
            f"advertise-client-urls: http://127.0.0.1:{client_port}\n"
            f"listen-peer-urls: http://127.0.0.1:{peer_port}\n"
            f"initial-advertise-peer-urls: http://127.0.0.1:{peer_port}\n"
            f"initial-cluster: cnclip-test=http://127.0.0.1:{peer_port}\n"
        )
        template = Path(self.package.__file__).parent / "data" / "config.yaml.template"
        text = template.read_text(encoding="utf-8")
        anchor = "  use:\n    embed: true"
        if anchor not in text:
            raise RuntimeError(f"the milvus {self.version} config template has no embedded-etcd section")
        text = text.replace(anchor, f"  config:\n    path: {etcd}\n{anchor}", 1)
        ours = configs / "milvus.yaml.template"
        ours.write_text(text, encoding="utf-8")
        config = self.package.MilvusServerConfig(template=str(ours), data_dir=str(self.base_dir))
        config.glog_conf_file = str(template.with_name("glog.conf"))  # set only for the default template
        for key in list(config.configurable_items):
            if key.endswith("_port"):
                config.set(key, client_port if key == "etcd_port" else free_port())
        return config

    def start(self) -> RealMilvus:
        """Start and wait until the server answers its health check (about 10 s)."""
        self.server = self.package.MilvusServer(self._config())
        self.server.webservice_port = free_port()  # metrics + /healthz; the package starts looking at 9091
        started = time.monotonic()
        try:
            self.server.start()
        except (TimeoutError, RuntimeError) as exc:
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"the Milvus server did not start: {exc}\n{tail}") from exc
        self.port = int(self.server.listen_port)
        self.startup_s = time.monotonic() - started
        return self

    @property
    def pid(self) -> int:
        return int(self.server.server_proc.pid)

    def log_tail(self, lines: int = 40) -> str:
        path = self.base_dir / "logs" / "milvus-stderr.log"
        try:
            return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def drop_every_collection(self) -> None:
        """Drop what the tests made (one server, many tests)."""
        from pymilvus import MilvusClient

        client = MilvusClient(uri=self.uri)
        try:
            for name in client.list_collections():
                client.drop_collection(name)
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the process (SIGTERM, SIGKILL after a while: its data dies with the base dir anyway)."""
        server, self.server = self.server, None
        if server is not None and server.server_proc is not None:
            process: subprocess.Popen[bytes] = server.server_proc
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)
            server.server_proc = None
            server.stop()  # closes its log files
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> RealMilvus:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
