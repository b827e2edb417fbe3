"""The watched folder as one directory, not a name: its identity pinned, walked from its descriptor,
and the one rule that says whether an indexed file is gone (and so may be pruned).

A path is only a name. `mv photos photos.real; ln -s /elsewhere photos` keeps the name and changes
what it means: a watcher that walks the name indexes `/elsewhere` and prunes every item of the real
folder. So a watcher pins the folder it was started on (`PinnedRoot`: device and inode, taken from a
descriptor opened with `O_DIRECTORY | O_NOFOLLOW` on the resolved path). Every walk opens the name
again, checks that the directory it gets is the pinned one, and goes down from that descriptor one
component at a time with `O_NOFOLLOW` (as indexer/fs/safe_open.py opens files): a folder swapped for a
symlink during a walk is not followed, and the root swapped during a walk is not walked at all.

Unreadable is not deleted: a folder the watcher may not open (`chmod 000`, EACCES) is skipped and
reported, and nothing under it is pruned. A path is gone only when the walk's own rules say so: it
no longer exists, a folder on its way is now a file or a symlink, or it is no longer a regular file
(a directory of the same name): indexer/fs/presence.py's rule, applied from the pinned descriptor by
`PinnedRoot.gone`. Any other error (EACCES, EIO, a stale NFS handle) keeps the row.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from indexer.bulk.sources import SourceEntry
from indexer.fs.presence import GONE_ERRNOS
from indexer.fs.presence import gone_error as _gone_errno
from indexer.fs.presence import indexable as _regular
from indexer.fs.safe_open import inside
from retrieval.errors import CnclipError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
Identity = tuple[int, int]  # (st_dev, st_ino)


class RootState(Enum):
    HERE = "here"  # the pinned folder, at its path
    UNREADABLE = "unreadable"  # the pinned folder, which this process may not open (permissions)
    GONE = "gone"  # nothing at the path (deleted, renamed away, unmounted and its mount point removed)
    REPLACED = "replaced"  # something else at the path: a symlink, a file, another folder


class RootMoved(CnclipError):
    """The watched folder is not the pinned one any more: nothing is read through it or pruned."""

    code = "conflict"

    def __init__(self, root: PinnedRoot, state: RootState) -> None:
        super().__init__(f"{root.path} is {state.value}")
        self.state = state


@dataclass
class Walk:
    """What one walk from the pinned folder found."""

    entries: list[SourceEntry] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (path, why): links out of the folder
    unreadable: dict[str, str] = field(default_factory=dict)  # folder or file path -> why (strerror)
    # Files changed within the quiet period, with their (size, mtime_ns, inode) then: read only if still.
    recent: list[tuple[SourceEntry, tuple[int, int, int]]] = field(default_factory=list)


@dataclass(frozen=True)
class PinnedRoot:
    """The watched folder (resolved once, at the start) and its identity."""

    path: Path
    device: int
    inode: int

    @classmethod
    def pin(cls, folder: Path) -> PinnedRoot:
        """Pin the folder now at `folder` (resolved). Raises OSError when it is not a folder."""
        resolved = folder.resolve()
        fd = os.open(resolved, DIR_FLAGS)
        try:
            info = os.fstat(fd)
        finally:
            os.close(fd)
        return cls(resolved, info.st_dev, info.st_ino)

    @property
    def identity(self) -> Identity:
        return self.device, self.inode

    def state(self) -> RootState:
        """Whether the pinned folder is at its path now (the last component is not followed: a
        symlink there is a replacement even when it leads back to the same folder)."""
        try:
            info = os.lstat(self.path)
        except OSError as exc:
            return RootState.GONE if _gone_errno(exc) or exc.errno == errno.EACCES else RootState.REPLACED
        if not stat.S_ISDIR(info.st_mode) or (info.st_dev, info.st_ino) != self.identity:
            return RootState.REPLACED
        try:
            os.close(os.open(self.path, DIR_FLAGS))
        except OSError as exc:
            return RootState.GONE if _gone_errno(exc) else RootState.UNREADABLE
        return RootState.HERE

    def check(self) -> None:
        """Raise `RootMoved` unless the pinned folder is at its path."""
        state = self.state()
        if state is not RootState.HERE:
            raise RootMoved(self, state)

    @contextlib.contextmanager
    def opened(self) -> Iterator[int]:
        """A descriptor of the pinned folder, opened at its path now; `RootMoved` when that is not it."""
        try:
            fd = os.open(self.path, DIR_FLAGS)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                state = RootState.REPLACED  # a symlink (ELOOP) or a file (ENOTDIR) at its path
            else:  # anything else (EACCES, EIO, a stale handle) says nothing of what is there: as `state`
                state = RootState.GONE if exc.errno == errno.ENOENT else RootState.UNREADABLE
            raise RootMoved(self, state) from exc
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != self.identity:
                raise RootMoved(self, RootState.REPLACED)
            yield fd
        finally:
            os.close(fd)

    # --- walking ---------------------------------------------------------------------------------
    def walk(
        self,
        start: Iterable[str] | None = None,
        *,
        skip: frozenset[Identity] = frozenset(),
        quiet_s: float = 0.0,
    ) -> tuple[Walk, list[str]]:
        """Every regular file under the folder (or under the `start` paths inside it: a hinted pass),
        with `indexer/bulk/sources.py`'s rules: hidden names skipped, symlinked folders not followed, a
        symlinked file indexed only when it leads to a file inside the folder. Folders in `skip`
        (the data dir: the product's own files) are not entered. Returns the walk and the `start`
        paths it reached (gone ones included: the scope of a hinted pass's prune)."""
        found = Walk()
        reached: list[str] = []
        now = time.time()
        with self.opened() as top:
            if start is None:
                self._walk_from(top, str(self.path), found, skip, quiet_s, now)
                return found, [str(self.path)]
            for path in sorted(set(start)):
                if self._walk_one(top, path, found, skip, quiet_s, now):
                    reached.append(path)
        return found, reached

    def _relative(self, path: str) -> list[str] | None:
        prefix = str(self.path).rstrip(os.sep) + os.sep
        if not path.startswith(prefix):
            return None
        parts = path[len(prefix) :].split(os.sep)
        if any(not part or part.startswith(".") or part == ".." for part in parts):
            return None
        return parts

    def _walk_one(
        self, top: int, path: str, found: Walk, skip: frozenset[Identity], quiet_s: float, now: float
    ) -> bool:
        """One hinted path: a file is looked at, a folder walked. False: a walk does not reach it
        (outside the folder, hidden, behind a symlinked folder, under an unreadable one)."""
        parts = self._relative(path)
        if parts is None:
            return False
        parent = self._descend(top, parts[:-1], path, found)
        if parent is None:
            return False
        if parent == -1:
            return True  # a folder on its way is gone: so is the path (its rows may be pruned)
        try:
            try:
                info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            except OSError as exc:
                if not _gone_errno(exc):
                    found.unreadable[path] = exc.strerror or str(exc)
                    return False
                return True
            if stat.S_ISDIR(info.st_mode):
                if (info.st_dev, info.st_ino) in skip:
                    return False
                try:
                    inner = os.open(parts[-1], DIR_FLAGS, dir_fd=parent)
                except OSError as exc:
                    if _gone_errno(exc):
                        return True
                    found.unreadable[path] = exc.strerror or str(exc)
                    return False
                self._walk_from(inner, path, found, skip, quiet_s, now, owned=True)
                return True
            self._file(parent, parts[-1], path, info, found, quiet_s, now)
            return True
        finally:
            if parent != top:
                os.close(parent)

    def _descend(self, top: int, names: list[str], path: str, found: Walk) -> int | None:
        """A descriptor of the folder holding `path` (the caller closes it unless it is `top`); -1 when
        a folder on the way is gone (or is a file now); None when the walk would not reach it."""
        fd = top
        for depth, name in enumerate(names):
            inner: int | None
            try:
                inner = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                inner = -1 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else None
                if exc.errno not in GONE_ERRNOS:
                    found.unreadable[os.path.join(self.path, *names[: depth + 1])] = exc.strerror or str(exc)
            finally:
                if fd != top:
                    os.close(fd)
            if inner is None or inner == -1:
                return inner
            fd = inner
        return fd

    def _walk_from(
        self,
        fd: int,
        path: str,
        found: Walk,
        skip: frozenset[Identity],
        quiet_s: float,
        now: float,
        *,
        owned: bool = False,
    ) -> None:
        """Walk the folder open at `fd` (named `path`), depth first, holding one descriptor per level.
        `owned`: `fd` is closed here."""
        stack: list[tuple[int, str, Iterator[str], bool]] = []
        try:
            subfolders = self._list(fd, path, found, quiet_s, now)
        except OSError as exc:  # the folder cannot be listed (EIO…): unreadable, as any folder below
            found.unreadable[path] = exc.strerror or str(exc)
            if owned:
                os.close(fd)
            return
        stack.append((fd, path, iter(subfolders), owned))
        while stack:
            folder_fd, folder, names, close = stack[-1]
            name = next(names, None)
            if name is None:
                stack.pop()
                if close:
                    os.close(folder_fd)
                continue
            inner_path = os.path.join(folder, name)
            try:
                inner = os.open(name, DIR_FLAGS, dir_fd=folder_fd)
            except OSError as exc:  # gone or a symlink now: not walked; else unreadable (kept)
                if not _gone_errno(exc):
                    found.unreadable[inner_path] = exc.strerror or str(exc)
                continue
            try:
                info = os.fstat(inner)
                if (info.st_dev, info.st_ino) in skip:
                    os.close(inner)
                    continue
                below = self._list(inner, inner_path, found, quiet_s, now)
            except OSError as exc:
                os.close(inner)
                found.unreadable[inner_path] = exc.strerror or str(exc)
                continue
            stack.append((inner, inner_path, iter(below), True))

    def _list(self, fd: int, folder: str, found: Walk, quiet_s: float, now: float) -> list[str]:
        """Look at the files of one open folder; returns its subfolders' names (sorted)."""
        subfolders: list[str] = []
        files: list[str] = []
        with os.scandir(fd) as listing:
            for entry in listing:
                if entry.name.startswith("."):
                    continue
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                (subfolders if is_dir else files).append(entry.name)
        for name in sorted(files):
            path = os.path.join(folder, name)
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                if not _gone_errno(exc):
                    found.unreadable[path] = exc.strerror or str(exc)
                continue
            self._file(fd, name, path, info, found, quiet_s, now)
        return sorted(subfolders)

    def _file(
        self, fd: int, name: str, path: str, info: os.stat_result, found: Walk, quiet_s: float, now: float
    ) -> None:
        """One name in a folder: a regular file (or a symlink to one inside the folder) is an entry,
        unless it changed within the quiet period (it may be still being written)."""
        if stat.S_ISLNK(info.st_mode):
            try:
                target = Path(os.path.realpath(path, strict=True))
                info = os.stat(name, dir_fd=fd)
            except (OSError, RuntimeError):
                return  # dangling, a loop, or unreadable: nothing a walk would index
            if not _regular(info):
                return
            if not inside(target, self.path):
                found.refused.append((path, "a symlink that leads outside the indexed folder: not followed"))
                return
        elif not _regular(info):
            return
        entry = SourceEntry(Path(path), root=self.path)
        if quiet_s > 0 and min(abs(now - info.st_mtime), abs(now - info.st_ctime)) < quiet_s:
            found.recent.append((entry, (info.st_size, info.st_mtime_ns, info.st_ino)))
            return
        found.entries.append(entry)

    # --- pruning ---------------------------------------------------------------------------------
    def gone(self, paths: Iterable[str]) -> set[str]:
        """Which of these paths (rows' paths under the folder) are gone, as the walk sees them from
        the pinned folder (see the module docstring: unreadable is not gone). `RootMoved` when the
        folder is not the pinned one: then nothing is gone. Paths are taken folder by folder, one
        descriptor per level held at a time."""
        gone: set[str] = set()
        relative = sorted((parts, path) for path in paths if (parts := self._relative(path)) is not None)
        with self.opened() as top:
            chain: list[tuple[str, int]] = []  # the open folders from the root down
            blocked: tuple[tuple[str, ...], bool] | None = None  # a folder that did not open: (where, gone)
            try:
                for parts, path in relative:
                    folder = parts[:-1]
                    if blocked is not None and tuple(folder[: len(blocked[0])]) == blocked[0]:
                        if blocked[1]:
                            gone.add(path)
                        continue
                    blocked = None
                    keep = 0
                    while keep < len(chain) and keep < len(folder) and chain[keep][0] == folder[keep]:
                        keep += 1
                    while len(chain) > keep:
                        os.close(chain.pop()[1])
                    for name in folder[keep:]:
                        try:
                            chain.append((name, os.open(name, DIR_FLAGS, dir_fd=chain[-1][1] if chain else top)))
                        except OSError as exc:
                            blocked = (tuple(folder[: len(chain) + 1]), _gone_errno(exc))
                            break
                    if blocked is not None:
                        if blocked[1]:
                            gone.add(path)
                        continue
                    if self._gone_file(chain[-1][1] if chain else top, parts[-1], path):
                        gone.add(path)
            finally:
                for _name, fd in chain:
                    os.close(fd)
        return gone

    def _gone_file(self, fd: int, name: str, path: str) -> bool:
        """Whether the walk would no longer index `name` in the folder open at `fd`: not there, not a
        regular file, or a symlink that now leads out of the folder (or nowhere). Unsure: False."""
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                if not inside(Path(os.path.realpath(path, strict=True)), self.path):
                    return True
                info = os.stat(name, dir_fd=fd)
        except OSError as exc:
            return _gone_errno(exc)
        except RuntimeError:  # a symlink loop
            return True
        return not _regular(info)
