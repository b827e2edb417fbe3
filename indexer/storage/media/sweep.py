"""The start-up sweep of the media folder (`cnclip serve` and `cnclip index` run it once).

Two kinds of leftovers: a copy with no SQL row (a process killed between writing the copy and
committing its row) and a `*.tmp-*` file (killed in the middle of a write). Several processes share
one data dir, so a file is removed only when it is older than `ORPHAN_GRACE_S` (no write or commit
takes that long) and, for a copy, when no row names its bytes at the moment it is removed: the
unreferenced candidates are re-checked against SQL under the media lock taken exclusively, which
every writer holds shared from writing a copy until its row commits (indexer/storage/media/store.py). Files the
sweep does not recognise are left alone.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from indexer.fs.disk_full import TEMP_MARK
from indexer.storage.media.store import EXTENSIONS, media_file, media_lock

log = logging.getLogger(__name__)

ORPHAN_GRACE_S = 3600.0  # an hour: far longer than any write + commit, short enough to matter
LOCK_WAIT_S = 10.0  # a sweep that cannot get the lock this long (uploads never pause) is skipped
_COPY_SUFFIXES = {*EXTENSIONS.values(), ".bin"}
_HEX = set("0123456789abcdef")


@dataclass(frozen=True)
class SweepResult:
    orphans: int  # copies no row names, removed
    temp_files: int  # stale temp files, removed
    skipped: bool = False  # the lock stayed busy: nothing removed


def _copy_sha(path: Path) -> str | None:
    """The sha256 a media copy's name carries (`ab/<64 hex>.jpg`), or None for any other file."""
    stem, suffix = path.name[:64], path.name[64:]
    if suffix in _COPY_SUFFIXES and len(stem) == 64 and set(stem) <= _HEX and path.parent.name == stem[:2]:
        return stem
    return None


def _old_files(media_dir: Path, cutoff: float) -> Iterable[Path]:
    """The regular files in media/xx/ last modified before `cutoff`."""
    for shard in media_dir.iterdir():
        if not shard.is_dir() or shard.is_symlink():
            continue
        for entry in os.scandir(shard):
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                yield Path(entry.path)


def _still_old(path: Path, cutoff: float) -> bool:
    try:
        return path.stat().st_mtime < cutoff
    except FileNotFoundError:
        return False


def sweep_media(
    media_dir: Path,
    referenced: Callable[[list[str]], set[str]],
    *,
    grace_s: float = ORPHAN_GRACE_S,
    lock_wait_s: float = LOCK_WAIT_S,
) -> SweepResult:
    """Remove orphaned copies and stale temp files older than `grace_s`; `referenced(shas)` answers
    which of `shas` some upload row still names. Logs one line with the counts."""
    if not media_dir.is_dir():
        return SweepResult(0, 0)
    cutoff = time.time() - grace_s
    temps: list[Path] = []
    copies: dict[str, Path] = {}
    for path in _old_files(media_dir, cutoff):
        if TEMP_MARK in path.name:
            temps.append(path)
        elif (sha := _copy_sha(path)) is not None:
            copies[sha] = path
    result = _remove(media_dir, temps, copies, referenced, cutoff, lock_wait_s)
    if result.skipped:
        log.warning("media sweep skipped: the media lock stayed busy for %.0f s (uploads in progress)", lock_wait_s)
    else:
        log.info(
            "media sweep: removed %d orphaned upload copies and %d stale temp files (older than %.0f s) under %s",
            result.orphans,
            result.temp_files,
            grace_s,
            media_dir,
        )
    return result


def _remove(
    media_dir: Path,
    temps: list[Path],
    copies: dict[str, Path],
    referenced: Callable[[list[str]], set[str]],
    cutoff: float,
    lock_wait_s: float,
) -> SweepResult:
    # A first answer without the lock: a copy named now is kept (even if its row goes later, whoever
    # deletes the row removes the copy), so only the few unnamed ones are asked again under the lock.
    in_use = referenced(sorted(copies))
    copies = {sha: path for sha, path in copies.items() if sha not in in_use}
    if not temps and not copies:
        return SweepResult(0, 0)
    deadline = time.monotonic() + lock_wait_s
    while True:
        with media_lock(media_dir, exclusive=True, blocking=False) as locked:
            if locked:
                # Under the lock no writer is between a copy and its commit: SQL's answer now is final.
                in_use = referenced(sorted(copies))
                orphans = [p for sha, p in copies.items() if sha not in in_use and _still_old(p, cutoff)]
                stale = [p for p in temps if _still_old(p, cutoff)]
                for path in orphans + stale:
                    path.unlink(missing_ok=True)
                return SweepResult(len(orphans), len(stale))
        if time.monotonic() >= deadline:
            return SweepResult(0, 0, skipped=True)
        time.sleep(0.05)


def remove_unused_copies(
    media_dir: Path, copies: Sequence[tuple[str, str | None]], uploads_in_use: Callable[[Sequence[str]], set[str]]
) -> None:
    """Unlink the upload copies (sha256, mime) of deleted rows that no row names any more, in any
    collection.

    Asked under the media lock, exclusively, like the sweep: a writer holds it shared from writing or
    touching its copy (the same content-addressed file) until the row naming it commits, so the answer
    here counts every row that will ever name these bytes. Asked before taking the lock, it would miss
    an upload of the same bytes to another collection committing meanwhile, whose file would go.
    `uploads_in_use` answers on a connection the caller holds already (indexer/storage/sql/lock_order.py): under
    this lock nothing may wait for a pooled connection, which uploads waiting for the lock may hold."""
    if not copies:
        return
    with media_lock(media_dir, exclusive=True):
        in_use = uploads_in_use(sorted({sha for sha, _ in copies}))
        for sha, mime in copies:
            if sha not in in_use:
                media_file(media_dir, sha, mime).unlink(missing_ok=True)
