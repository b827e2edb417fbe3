"""Opening a file under a folder without ever following a symlink out of it (serving and indexing).

A path is only a name: between a check and an open, whoever can write into the folder can swap any
of its components for a symlink to `/etc/passwd`, so "resolve, check, then open the path" opens
whatever is there at the moment of the open. Here the path is resolved once (a symlink that stays
inside the folder is allowed), checked to lie inside the folder, and then opened one component at a
time from the folder's own descriptor with `O_NOFOLLOW`: the resolved path has no symlink left, so
if one was swapped in since the check the open fails instead of following it. The descriptor
returned is a regular file that really lies inside the folder; callers read from it, never from
the path again.

Without a folder (rows indexed before storage v2, manifest entries) only a path without any symlink
is opened, walked the same way from `/`. `O_NONBLOCK`: a FIFO swapped in must not hang the open (it
is then refused as not a regular file).

Unreadable is not missing: an error that does not say the file is gone (EACCES on the file or a
folder on its way, EIO) is raised as the `OSError` it is, for the caller to report as such.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from indexer.fs.presence import gone_error
from retrieval.errors import NotFound

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class FileRefused(NotFound):
    """A file that is not opened: missing, not a regular file, or reached only by leaving its folder.
    `reason` completes "the file ...", e.g. "is missing"."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the file {reason}")
        self.reason = reason


def inside(path: Path, root: Path) -> bool:
    """Whether `path` is `root` or lies under it (both already resolved)."""
    return path == root or root in path.parents


def open_inside(path: Path, root: Path | None) -> int:
    """A read-only descriptor of the regular file at `path`, reached without leaving `root` (see the
    module docstring); `FileRefused` says why not. The caller closes it."""
    absolute = Path(os.path.abspath(path))
    try:
        real = absolute.resolve(strict=True)
        anchor = Path(root).resolve(strict=True) if root is not None else Path(absolute.anchor)
    except RuntimeError as exc:  # a symlink loop
        raise FileRefused("is missing") from exc
    except OSError as exc:  # missing or a dangling link; anything else (EACCES, EIO) is raised as is
        _refuse_if_gone(exc)
        raise
    if root is None and real != absolute:
        raise FileRefused("goes through a symlink (and its indexed folder is unknown)")
    if not inside(real, anchor) or real == anchor:
        raise FileRefused("is outside its indexed folder (through a symlink)")
    parts = real.relative_to(anchor).parts
    fd = _walk(anchor, parts)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise FileRefused("is not a regular file")
    return fd


def _walk(anchor: Path, parts: tuple[str, ...]) -> int:
    """Open `anchor/parts...` component by component, following no symlink."""
    try:
        folder = os.open(anchor, _DIR_FLAGS)
    except OSError as exc:
        _refuse_if_gone(exc)
        raise
    try:
        for name in parts[:-1]:
            inner = os.open(name, _DIR_FLAGS, dir_fd=folder)
            os.close(folder)
            folder = inner
        return os.open(parts[-1], _FILE_FLAGS, dir_fd=folder)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a component became a symlink since it was resolved
            raise FileRefused("was replaced by a symlink while it was opened") from exc
        _refuse_if_gone(exc)
        raise
    finally:
        os.close(folder)


def _refuse_if_gone(exc: OSError) -> None:
    """`FileRefused` when the error says that the file is not there (indexer/fs/presence.py's rule);
    otherwise the caller raises the `OSError` itself: unreadable (EACCES, EIO) is not missing, and
    an indexer that took it for missing would treat the file's item as gone."""
    if gone_error(exc):
        raise FileRefused("is missing") from exc
