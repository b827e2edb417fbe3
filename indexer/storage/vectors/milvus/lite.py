"""Milvus Lite: one process per file. pymilvus runs the Lite server inside the process that opens the
file, which holds a `flock` on `<file>/LOCK`; each process that opens a Lite file writes
`<file>.owner` (pid and command line), so a second process is told which process holds the file
(`VectorStoreBusy`) instead of a bare lock error and Lite's own traceback."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import stat
import sys
import threading
import time
from pathlib import Path

from pymilvus import MilvusClient, MilvusException

from indexer.errors import VectorStoreBusy, VectorStoreUnavailable
from retrieval.json_text import loads
from retrieval.regular_file import kind_of

# pymilvus runs one Lite server per file per process and keeps it until exit; engines of one
# process (a test's two catalogs, say) share it, so the last one to close stops it and frees the file.
_lite_users: dict[str, int] = {}
_lite_lock = threading.Lock()


class _LiteUnimplemented(logging.Filter):
    """Milvus Lite runs its gRPC server in this process and lacks some RPCs pymilvus tries first
    (AllocTimestamp, when a query iterator starts; pymilvus then falls back by itself). grpc logs
    each as an ERROR with a traceback on the user's terminal: drop exactly those records."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], NotImplementedError))


def is_lite(uri: str) -> bool:
    return not uri.startswith(("http://", "https://", "tcp://", "unix:"))


def check_lite_file(path: Path) -> None:
    """`VectorStoreUnavailable` (one line) when `path` is something Lite cannot use: a FIFO, a device or
    a socket named by CNCLIP_MILVUS_URI. Missing is fine (Lite makes it), and so are a file and the
    folder Milvus Lite keeps its data in."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise VectorStoreUnavailable(f"cannot open the Milvus Lite file {path}: {exc.strerror or exc}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise VectorStoreUnavailable(f"cannot open the Milvus Lite file: {path} is {kind_of(mode)}, not a file")


def open_lite(path: Path) -> MilvusClient:
    """A client of the Lite file at `path` (opened in this process, shared by its engines);
    `VectorStoreBusy` naming the process that holds it, `VectorStoreUnavailable` for a file Lite
    cannot open."""
    path.parent.mkdir(parents=True, exist_ok=True)
    check_lite_file(path)
    grpc_log = logging.getLogger("grpc._server")
    if not any(isinstance(f, _LiteUnimplemented) for f in grpc_log.filters):
        grpc_log.addFilter(_LiteUnimplemented())
    with _lite_lock:
        if str(path) not in _lite_users and _lite_locked(path):
            raise VectorStoreBusy(_busy_message(path))  # before Lite logs a traceback of its own
        try:
            client = MilvusClient(uri=str(path))
        except MilvusException as exc:
            if _lite_locked(path):
                raise VectorStoreBusy(_busy_message(path)) from exc
            raise VectorStoreUnavailable(f"cannot open the Milvus Lite file {path}: {exc.message}") from exc
        _lite_users[str(path)] = _lite_users.get(str(path), 0) + 1
        _write_owner(path)
    return client


# --- the Lite file's owner -----------------------------------------------------------------------
def _owner_path(path: Path) -> Path:
    return path.with_name(path.name + ".owner")


def _write_owner(path: Path) -> None:
    """Say which process holds the file (read by a process that finds it locked)."""
    owner = {"pid": os.getpid(), "command": " ".join(sys.argv)[:500], "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    temp = _owner_path(path).with_name(f"{path.name}.owner.tmp-{os.getpid()}")
    temp.write_text(json.dumps(owner))
    temp.replace(_owner_path(path))


def release_lite(path: Path) -> None:
    """This process is done with the file: the last of its engines to close stops the Lite server."""
    with _lite_lock:
        users = _lite_users.get(str(path), 0) - 1
        if users > 0:
            _lite_users[str(path)] = users
            return
        _lite_users.pop(str(path), None)
        from milvus_lite.server_manager import server_manager_instance

        server_manager_instance.release_server(str(path))
        _owner_path(path).unlink(missing_ok=True)


def _lite_locked(path: Path) -> bool:
    """Whether another process holds the Lite file's lock (probed, then let go at once)."""
    lock = path / "LOCK"
    if not lock.exists():
        return False
    with open(lock, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return False


def _busy_message(path: Path) -> str:
    try:
        owner = loads(_owner_path(path).read_text())
        who = f"process {int(owner['pid'])} ({str(owner['command'])[:200]!r}, since {owner['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        who = "another process (it left no owner file)"
    return (
        f"the Milvus Lite file {path} is in use by {who}; Milvus Lite takes one process per file. "
        "Stop that process, or point CNCLIP_MILVUS_URI at a Milvus server for several processes."
    )
