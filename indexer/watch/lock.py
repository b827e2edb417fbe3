"""One watcher per folder and collection on a machine: an advisory file lock under the data dir.

Two watchers of one folder would not duplicate items (SQL keeps one row per sha256 per collection,
and writers of a collection are serialised by its version bump, indexer/storage/sql/rows.py), but they would
read and embed every new file twice, and two reconciles racing on one path could each record a
different content for it. So the second one stands by: it says so in one line and takes over when
the first stops (or is killed: the kernel releases a killed process's `flock`).

The lock lives in the data dir, so it covers the processes of one machine sharing that dir (a
server's watchers and `cnclip index --watch`); machines sharing only a PostgreSQL database each
need their own folder to watch.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from pathlib import Path
from typing import IO

from indexer.domain.names import collection_key


class FolderLock:
    """The lock of (collection, folder). `try_acquire` never blocks."""

    def __init__(self, lock_dir: Path, collection: str, folder: Path) -> None:
        key = hashlib.sha256(f"{collection_key(collection)}\0{folder}".encode("utf-8", "surrogateescape"))
        self.path = lock_dir / f"watch-{key.hexdigest()[:24]}.lock"
        self.collection = collection
        self.folder = folder
        self._handle: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._handle is not None

    def try_acquire(self) -> bool:
        """Take the lock (True), or find it held by another process (False)."""
        if self._handle is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8", errors="surrogateescape")  # noqa: SIM115 - held until release
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n{self.collection}\n{self.folder}\n")
        handle.flush()
        self._handle = handle
        return True

    def holder(self) -> str:
        """The process id written by the holder ("?" when unreadable)."""
        try:
            first = self.path.read_text(encoding="utf-8", errors="replace").split("\n", 1)[0].strip()
        except OSError:
            return "?"
        return first if first.isdigit() else "?"

    def release(self) -> None:
        if self._handle is None:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None
