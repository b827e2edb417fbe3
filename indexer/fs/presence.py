"""The one rule that says whether an indexed file is gone, and so whether its row may be pruned.

Unreadable is not deleted. A path is gone only when a walk would not find a file there any more:
nothing is there (ENOENT), a folder on its way is now a file or a symlink (ENOTDIR, ELOOP), or what
is there is not a regular file (a directory of the same name, a FIFO). Any other error (EACCES on a
folder made unreadable, EIO, a stale NFS handle) keeps the row: it is decided again by the next run.
`file_gone` asks by path (`cnclip index --prune`, `row_gone`: only under a folder that is still
there, see `root_here`); a watcher asks from its pinned folder's
descriptor with the same rule (indexer/watch/root.py, `PinnedRoot.gone`).
"""

from __future__ import annotations

import errno
import os
import stat

GONE_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


def gone_error(exc: OSError) -> bool:
    """Whether an error looking a path up says that it is not there (rather than "cannot tell")."""
    return exc.errno in GONE_ERRNOS


def indexable(info: os.stat_result) -> bool:
    """Whether what a path leads to (symlinks followed) is a file a walk indexes: a regular file."""
    return stat.S_ISREG(info.st_mode)


def root_here(root: str | None) -> bool:
    """Whether the folder a row was indexed from is at its path as that folder: a directory, reached
    without a symlink (`cnclip index --prune` keeps the rows of a folder that is away: an unmounted
    share, a folder renamed away, or replaced by a symlink to another folder, itself or one above it,
    is not a folder whose files were all deleted — the watcher's rule, indexer/watch/root.py). Unsure
    (EACCES on the way): not here. None (a row from before roots were recorded): here."""
    if root is None:
        return True
    try:
        info = os.lstat(root)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and os.path.realpath(root) == os.path.normpath(root)


def row_gone(path: str, root: str | None) -> bool:
    """Whether a row may be pruned by `cnclip index --prune`: its folder is here and its file gone."""
    return root_here(root) and file_gone(path)


def file_gone(path: str) -> bool:
    """Whether the file of a row is gone, by its path: see the module docstring. A symlinked file
    counts by its target, as the walk that indexed it did."""
    try:
        info = os.stat(path)
    except OSError as exc:
        return gone_error(exc)
    return not indexable(info)
