"""When a save appends to the log and when it rewrites the base (the formats: file.py, delta.py).

A save appends the batches added and removed since the last one (`ChangeTracker`) to the base's log,
so its cost follows what changed, not the collection's size. It rewrites the base instead, and drops
the log, when:
- nothing of this index is on disk yet, or the base has no token (saved before logs existed);
- the index was rebuilt and swapped in (`needs_full_save`), or what the header says of it (what it is,
  `active`; its model, owner) changed: the log records changes to one index, its header none;
- the log would pass `log_allowance` — a quarter of the base's vectors, at least `DELTA_MIN` ids —
  so replaying it on open stays a fraction of reading the base, and the log never outgrows it;
- the files are not those this process last wrote or read (the base's inode/size/mtime or the log's
  size moved): another process sharing the data dir saved since, or an append was torn. Appending
  then could replay a change twice or after a torn record; rewriting from memory is always right.
Saves are made under the store's exclusive file lock (store.py), so these checks are not racy.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from indexer.storage.vectors.faiss.delta import Change, append_changes, delta_path, log_size, replay_changes
from indexer.storage.vectors.faiss.file import write_index_file

DELTA_SHARE = 0.25  # the log may carry up to this share of the base's vectors before the base is rewritten
DELTA_MIN = 4096  # and at least this many ids: a small base is cheap to rewrite, but not on every save
PENDING_MAX_BYTES = 256 << 20  # vectors kept in memory for the next append; past it, the next save rewrites


def log_allowance(base_vectors: int) -> int:
    """Ids (added or removed) the log of a base of `base_vectors` may carry before a save compacts."""
    return max(DELTA_MIN, int(DELTA_SHARE * base_vectors))


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """What tells one written file from another at `path`: a rename brings a new inode."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


@dataclass(frozen=True)
class OnDisk:
    """The files as this process last wrote or read them: the base's identity and token, its vector
    count, and how many bytes and ids of the log are records this process knows (`log_size` -1: the
    log holds something else, so the next save rewrites the base)."""

    base: tuple[int, int, int] | None
    token: str | None
    base_vectors: int
    described: dict[str, Any]  # the base's header but for what the log carries (tombstones) and its token
    log_size: int = 0
    log_entries: int = 0


def _described(header: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in header.items() if key not in ("tombstones", "base")}


class ChangeTracker:
    """The batches added and removed since the last save, in order, with copies of the added vectors
    (an IVF-PQ index cannot give its vectors back exactly). Bounded: past what the log may still take
    (`room`) or `PENDING_MAX_BYTES`, they are dropped and the next save rewrites the base, as it would
    have had to anyway. While a rewrite is due (`full_save`) nothing is kept."""

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.entries = 0
        self.bytes = 0
        self.room = 0
        self.full_save = True  # nothing saved yet

    def added(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if not self.full_save:
            self._keep(Change(np.array(ids, dtype=np.int64), np.array(vectors, dtype=np.float32)))

    def removed(self, ids: np.ndarray) -> None:
        if not self.full_save:
            self._keep(Change(np.array(ids, dtype=np.int64)))

    def _keep(self, change: Change) -> None:
        self.entries += change.entries
        self.bytes += change.ids.nbytes + (change.vectors.nbytes if change.vectors is not None else 0)
        if self.entries > self.room or self.bytes > PENDING_MAX_BYTES:
            self.rewrite()
        else:
            self.changes.append(change)

    def rewrite(self) -> None:
        """The next save writes the whole base (and drops the log)."""
        self.full_save, self.changes, self.entries, self.bytes = True, [], 0, 0

    def saved(self, room: int) -> None:
        """What was pending is on disk; the log may take `room` more ids."""
        self.full_save, self.changes, self.entries, self.bytes, self.room = False, [], 0, 0, room


class IndexFiles:
    """One index's base file and log, as this process knows them, and what its next save writes.
    The owner (`VectorIndex`) calls `changes.added/removed` under its write lock and `save` under its
    read lock, so no change slips in between a save's snapshot and its `saved`."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.changes = ChangeTracker()
        self.on_disk: OnDisk | None = None
        self._saving = threading.Lock()  # two savers of one index would append its changes twice

    def save(self, path: Path, header: dict[str, Any], index: faiss.Index) -> None:
        with self._saving:
            if not self._appended(path, header):
                self._rewrite(path, header, index)

    def _appended(self, path: Path, header: dict[str, Any]) -> bool:
        """Whether the changes since the last save are on disk now, appended to the log (or none)."""
        disk, log = self.on_disk, delta_path(path)
        if self.changes.full_save or disk is None or disk.token is None or disk.described != _described(header):
            return False
        if file_identity(path) != disk.base or log_size(log) != disk.log_size:
            return False
        if self.changes.changes:
            size = append_changes(log, disk.token, self.dim, self.changes.changes, disk.log_size)
            entries = disk.log_entries + self.changes.entries
            disk = self.on_disk = OnDisk(disk.base, disk.token, disk.base_vectors, disk.described, size, entries)
        self.changes.saved(log_allowance(disk.base_vectors) - disk.log_entries)
        return True

    def _rewrite(self, path: Path, header: dict[str, Any], index: faiss.Index) -> None:
        token = uuid.uuid4().hex  # names this base in its log, so no other base replays that log
        write_index_file(path, {**header, "base": token}, index)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        # The old log's changes are in the new base (a log a crash keeps names the old base's token).
        delta_path(path).unlink(missing_ok=True)
        base_vectors = int(index.ntotal)
        self.on_disk = OnDisk(file_identity(path), token, base_vectors, _described(header))
        self.changes.saved(log_allowance(base_vectors))

    def replay(
        self,
        path: Path,
        identity: tuple[int, int, int] | None,
        header: dict[str, Any],
        base_vectors: int,
        apply: Callable[[Change], None],
    ) -> str | None:
        """`apply` the log of the base just read from `path` (`identity`: its stat before the read);
        returns why the log was not replayed whole, if it was not. Such a log, or a base saved before
        logs existed, is rewritten away at the next save; what it lacked, SQL's catch-up adds back."""
        token = header.get("base") if isinstance(header.get("base"), str) else None
        replay = replay_changes(delta_path(path), token, self.dim, apply)
        log_bytes = -1 if replay.problem else replay.valid_size
        self.on_disk = OnDisk(identity, token, base_vectors, _described(header), log_bytes, replay.entries)
        if token is not None:
            self.changes.saved(log_allowance(base_vectors) - replay.entries)
        return replay.problem
