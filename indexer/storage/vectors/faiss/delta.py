"""The append-only log of what changed since a collection's index file (its *base*) was written.

Why: rewriting the whole base per save made adding 200 photos to a 1M collection cost a 2 GB write
(issue 34: 24 s against 12 s at 10k). So a save appends the batches added and removed since the last
save to `<base>.delta`, and only rewrites the base (then drops the log) when the log has grown past a
share of the base or the index was rebuilt (indexer/storage/vectors/faiss/saving.py decides; this
module is the format, file.py the base's).

Layout: `CNCLIPDL1`, then records. A record is a kind byte, the payload's length (u64), the payload
and a CRC-32 over kind, length and payload. The first record is the header (`H`, JSON: the base's
random `base` token and `dim`); then `A` (ids int64 ×n, then their float32 vectors n×dim) and `R`
(removed ids int64 ×n), in the order they happened, so a removal followed by a re-add of one id
replays as it was done.

Crash safety: every append is flushed and fsynced before the save counts as done. A record cut short
(a crash or a full disk mid-append) or damaged stops the replay there: what came before is a state
the index really had, and what is lost is derived data that the SQL catch-up on open
(indexer/storage/sync.py) adds back. The token ties a log to one base: a log left beside another base
(a crash between writing a new base and removing the old log) is ignored, never replayed onto it.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from indexer.errors import StorageFull
from indexer.fs.disk_full import is_storage_full
from retrieval.json_text import loads
from retrieval.regular_file import UnusableFile, open_regular

LOG_MAGIC = b"CNCLIPDL1"
HEADER, ADDED, REMOVED = b"H", b"A", b"R"
_PREFIX = struct.Struct("<cQ")  # kind, payload length
_CRC = struct.Struct("<I")
_MAX_HEADER = 1 << 16


@dataclass
class Change:
    """One batch added (`vectors` set) or removed (`vectors` None), as it was applied to the index."""

    ids: np.ndarray
    vectors: np.ndarray | None = None

    @property
    def entries(self) -> int:
        return len(self.ids)


@dataclass
class Replay:
    """What reading a log gave: how many bytes of it are whole records of this base (`valid_size`;
    0: no usable log), how many ids its records carried, and why it stopped early, if it did."""

    valid_size: int = 0
    entries: int = 0
    problem: str | None = None
    records: int = 0  # the header included


def delta_path(base: Path) -> Path:
    return base.with_name(base.name + ".delta")


def _record(kind: bytes, *parts: bytes) -> list[bytes]:
    length = sum(len(p) for p in parts)
    prefix = _PREFIX.pack(kind, length)
    crc = zlib.crc32(prefix)
    for part in parts:
        crc = zlib.crc32(part, crc)
    return [prefix, *parts, _CRC.pack(crc)]


def log_size(path: Path) -> int | None:
    """The size of the log at `path`: 0 when there is none, None when something other than a regular
    file sits there (a link, a folder): the caller rewrites the base instead of appending to it."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return 0
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def append_changes(path: Path, token: str, dim: int, changes: list[Change], size: int) -> int:
    """Append `changes` to the log at `path`, which holds `size` bytes of this base's records (0:
    start a new log); returns its new size. Anything past `size` (a torn record of a failed append) is
    cut first, so the new records follow whole ones. Flushed and fsynced before returning; a full
    disk is `StorageFull`, and the log is cut back to `size`."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o644)
    try:
        os.ftruncate(fd, size)
        os.lseek(fd, size, os.SEEK_SET)
        parts: list[bytes] = []
        if size == 0:
            parts += [LOG_MAGIC, *_record(HEADER, json.dumps({"base": token, "dim": dim}).encode())]
        for change in changes:
            ids = np.ascontiguousarray(change.ids, dtype="<i8").tobytes()
            if change.vectors is None:
                parts += _record(REMOVED, ids)
            else:
                parts += _record(ADDED, ids, np.ascontiguousarray(change.vectors, dtype="<f4").tobytes())
        try:
            for part in parts:
                _write_all(fd, part)
            os.fsync(fd)
        except OSError as exc:
            os.ftruncate(fd, size)  # leave whole records only (a later append would follow a torn one)
            if is_storage_full(exc):
                raise StorageFull(f"no space left to append to {path.name}: {exc.strerror}") from exc
            raise
        end = os.lseek(fd, 0, os.SEEK_CUR)
    finally:
        os.close(fd)
    if size == 0:  # a new file: its name must survive a crash too
        _fsync_folder(path.parent)
    return end


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replay_changes(path: Path, token: str | None, dim: int, apply: Callable[[Change], None]) -> Replay:
    """Read the log at `path` and `apply` each whole record of the base named `token`, in order. A log
    of another base, or none, applies nothing; a torn or damaged record stops the replay (`problem`)."""
    try:
        handle = os.fdopen(open_regular(path), "rb")
    except UnusableFile as exc:
        return Replay(problem=None if exc.missing else f"log {exc.reason}")
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if handle.read(len(LOG_MAGIC)) != LOG_MAGIC:
            return Replay(problem="not a log of this index")
        done = Replay(valid_size=len(LOG_MAGIC))
        while done.valid_size < size:
            record = _read_record(handle, size - done.valid_size)
            if record is None:
                return Replay(done.valid_size, done.entries, "a torn or damaged record", done.records)
            kind, payload = record
            if done.records == 0:  # the header: whose log this is
                if kind != HEADER or not _is_header_of(payload, token, dim):
                    return Replay(problem="the log of another index file")
            else:
                change = _decode(kind, payload, dim)
                if change is None:
                    return Replay(done.valid_size, done.entries, "a record of another shape", done.records)
                apply(change)
                done.entries += change.entries
            done.valid_size += _PREFIX.size + len(payload) + _CRC.size
            done.records += 1
        return done


def _read_record(handle: BinaryIO, left: int) -> tuple[bytes, bytes] | None:
    read = handle.read
    prefix = read(_PREFIX.size)
    if len(prefix) < _PREFIX.size:
        return None
    kind, length = _PREFIX.unpack(prefix)
    if kind not in (HEADER, ADDED, REMOVED) or length > left - _PREFIX.size - _CRC.size:
        return None
    payload = read(length)
    crc = read(_CRC.size)
    if len(payload) < length or len(crc) < _CRC.size:
        return None
    if _CRC.unpack(crc)[0] != zlib.crc32(payload, zlib.crc32(prefix)):
        return None
    return kind, payload


def _is_header_of(payload: bytes, token: str | None, dim: int) -> bool:
    if token is None or len(payload) > _MAX_HEADER:
        return False
    try:
        header = loads(payload)
    except ValueError:
        return False
    return isinstance(header, dict) and header.get("base") == token and header.get("dim") == dim


def _decode(kind: bytes, payload: bytes, dim: int) -> Change | None:
    if kind == REMOVED:
        if len(payload) % 8:
            return None
        return Change(np.frombuffer(payload, dtype="<i8").astype(np.int64))
    if kind != ADDED or len(payload) % (8 + 4 * dim):
        return None
    count = len(payload) // (8 + 4 * dim)
    ids = np.frombuffer(payload, dtype="<i8", count=count).astype(np.int64)
    vectors = np.frombuffer(payload, dtype="<f4", offset=8 * count).astype(np.float32).reshape(count, dim)
    return Change(ids, vectors)
