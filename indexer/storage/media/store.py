"""The content-addressed copy of uploaded image bytes under the data dir.

A copy is written as `NAME.tmp-PID-THREAD` and renamed into place, so a crash never leaves half a
file; a failed write removes its temp file. A full disk (or quota) is `StorageFull`, not an OSError.

The copy is written before the SQL row that names it commits, so a process killed in between leaves
an orphan; `indexer/storage/media/sweep.py` removes those at start-up. Writers hold the media folder's lock
shared from the copy to the commit (`media_writes`) and the sweep takes it exclusively, so the
sweep never deletes a copy that some process, this one or another, is about to commit a row for.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from indexer.fs.disk_full import StorageFull, is_storage_full, write_atomically
from retrieval.raw_photos import RAW_MIMES

EXTENSIONS = {
    "image/jpeg": ".jpg",
    "image/png": ".png",
    "image/webp": ".webp",
    "image/gif": ".gif",
    "image/bmp": ".bmp",
    "image/heif": ".heic",
    "image/avif": ".avif",
    **{mime: f".{kind.lower()}" for kind, mime in RAW_MIMES.items()},
}

LOCK_NAME = ".lock"  # media/.lock: shared by writers until commit, exclusive for the sweep


def media_root(data_dir: Path) -> Path:
    """The folder under the data dir that holds the copies of uploaded images."""
    return data_dir / "media"


def media_file(media_dir: Path, sha256: str, mime: str | None) -> Path:
    """Where an upload with this content lives: media/ab/abcdef….jpg (content-addressed)."""
    return media_dir / sha256[:2] / f"{sha256}{EXTENSIONS.get(mime or '', '.bin')}"


@contextmanager
def media_lock(media_dir: Path, *, exclusive: bool, blocking: bool = True) -> Iterator[bool]:
    """The media folder's advisory lock (flock on media/.lock); yields whether it was taken (only a
    non-blocking attempt can yield False)."""
    try:
        media_dir.mkdir(parents=True, exist_ok=True)
        handle = open(media_dir / LOCK_NAME, "a+b")  # noqa: SIM115 (closed below, after the lock is released)
    except OSError as exc:
        if is_storage_full(exc):
            raise StorageFull(f"no space left under {media_dir} for its lock file: {exc.strerror}") from exc
        raise
    with handle:
        flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(handle.fileno(), flags)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextmanager
def media_writes(media_dir: Path) -> Iterator[None]:
    """Hold this around writing copies and committing their rows (shared: writers never wait on
    each other, only on a running sweep)."""
    with media_lock(media_dir, exclusive=False):
        yield


def store_media(media_dir: Path, sha256: str, mime: str | None, data: bytes) -> Path:
    """Copy upload bytes in place once (temp file + rename). Call inside `media_writes`.

    An existing copy has its mtime refreshed: the sweep only ever considers copies older than its
    grace period, so one about to be referenced again looks fresh even to a sweep without the lock."""
    target = media_file(media_dir, sha256, mime)
    try:
        os.utime(target)
        return target
    except FileNotFoundError:
        pass
    write_atomically(target, [data], "store")
    return target
