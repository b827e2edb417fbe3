"""Where a folder watcher's hints come from: the kernel's events (inotify, through `watchfiles`), or
polling where those cannot see.

Events are hints only ("look at this path"); what happened is decided by reconciling the folder with
SQL (indexer/watch/passes.py), so a lost, merged or reordered event costs latency, never correctness
(the periodic rescan catches what no hint named). inotify sees only changes made through this
machine's kernel: a network filesystem (NFS, SMB, sshfs, 9p…) changed by another machine sends
nothing, so such folders are polled, and so is a folder whose tree would pass the inotify watch limit.

Polling compares a snapshot of (size, mtime, inode) per file with the previous one. It never runs
away on a slow share: the next sweep starts no sooner than four times the last sweep's duration, so
a share is being walked at most a fifth of the time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

log = logging.getLogger(__name__)

Snapshot = dict[str, tuple[int, int, int]]  # path -> (size, mtime_ns, inode)

# Filesystems whose changes made elsewhere inotify never reports (their types in /proc/self/mountinfo).
REMOTE_FILESYSTEMS = {
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre", "gpfs", "davfs",
    "virtiofs", "beegfs", "ncpfs", "coda",
}  # fmt: skip
POLL_DUTY = 4.0  # a sweep that took t seconds is followed by at least POLL_DUTY × t of rest


def filesystem_type(folder: Path, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem `folder` (resolved) lives on, from the longest mount point that holds
    it; None where the mount table cannot be read (not Linux)."""
    best, kind = "", None
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return None
    target = str(folder)
    for line in lines:
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        point = parts[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, rest.split()[0]
    return kind


def needs_polling(fs_type: str | None) -> bool:
    """Whether inotify misses changes on this filesystem type (remote ones, and FUSE mounts)."""
    return fs_type is not None and (fs_type in REMOTE_FILESYSTEMS or fs_type.startswith("fuse."))


def snapshot(top: Path) -> Snapshot:
    """(size, mtime_ns, inode) of every file and folder a walk of `top` reaches: hidden ones skipped,
    symlinked folders not followed (as indexer/bulk/sources.py walks)."""
    seen: Snapshot = {}
    pending = [str(top)]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as found:
                for entry in found:
                    if entry.name.startswith("."):
                        continue
                    try:
                        stat = entry.stat(follow_symlinks=False)
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(entry.path)
                    except OSError:
                        continue  # gone meanwhile
                    seen[entry.path] = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
        except OSError:
            continue  # a folder removed or unreadable meanwhile: its paths count as gone
    return seen


def changed_paths(before: Snapshot, after: Snapshot) -> set[str]:
    """Paths added, removed or changed between two snapshots."""
    gone = before.keys() - after.keys()
    return gone | {path for path, sig in after.items() if before.get(path) != sig}


async def _rest(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def poll_hints(top: Path, interval_s: float, stop: asyncio.Event) -> AsyncIterator[set[str]]:
    """Changed paths, found by comparing snapshots every `interval_s` (or longer, see POLL_DUTY)."""
    before = await asyncio.to_thread(snapshot, top)
    took = 0.0
    while not stop.is_set():
        await _rest(stop, max(interval_s, POLL_DUTY * took))
        if stop.is_set():
            return
        started = time.monotonic()
        after = await asyncio.to_thread(snapshot, top)
        took = time.monotonic() - started
        changed = changed_paths(before, after)
        before = after
        if changed:
            yield changed


async def inotify_hints(top: Path, stop: asyncio.Event) -> AsyncIterator[set[str]]:
    """Changed paths as the kernel reports them (watchfiles over inotify, recursive). Raises
    `ImportError` without watchfiles and `OSError` when the watches cannot be set up (the inotify
    watch limit reached, among others): the caller polls instead."""
    from watchfiles import awatch

    # debounce/step: hand over what arrived after 50 ms of calm (at most 200 ms late); the watcher's own
    # quiet period (indexer/watch/debounce.py) decides when a file is complete. rust_timeout: `stop` is seen
    # within a second.
    async for changes in awatch(
        top,
        watch_filter=None,
        debounce=200,
        step=50,
        stop_event=stop,
        rust_timeout=1000,
        recursive=True,
        ignore_permission_denied=True,
        force_polling=False,
    ):
        yield {path for _change, path in changes}
