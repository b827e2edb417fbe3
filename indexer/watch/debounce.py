"""Debouncing a folder watcher's hints: a path is reconciled once it has been quiet for a while.

File-system events say only "look here". A file being copied or saved produces a burst of them, and
a reader that acts on the first one reads it half-written. So each hinted path waits until its size
and mtime (as `os.stat` sees them, or its absence) have stayed the same for `quiet_s`; every new
hint, and every change of the signature seen when it is checked, starts the wait again. A path that
never settles (a log file written forever) is let through after `longest_s`, so one busy file does
not hold back the others: the pipeline reads it as it is then, and the next hint reads it again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

Signature = tuple[int, int, int] | None  # (size, mtime_ns, inode), None when the path is gone


def signature(path: str) -> Signature:
    """What a write changes: size, mtime and inode (a save by rename gives a new inode)."""
    try:
        stat = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns, stat.st_ino


@dataclass
class _Waiting:
    signature: Signature
    quiet_since: float  # monotonic time of the last hint or change
    first_seen: float


class QuietPaths:
    """The hinted paths that are still moving. Not thread-safe: one watcher's loop owns it."""

    def __init__(
        self, quiet_s: float, *, longest_s: float | None = None, stat: Callable[[str], Signature] = signature
    ) -> None:
        if quiet_s < 0:
            raise ValueError("the quiet period must not be negative")
        self.quiet_s = quiet_s
        self.longest_s = longest_s if longest_s is not None else max(60.0, 20 * quiet_s)
        self._stat = stat
        self._waiting: dict[str, _Waiting] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def hint(self, path: str, now: float) -> None:
        """Something happened at `path`: wait for it to be quiet (again)."""
        waiting = self._waiting.get(path)
        if waiting is None:
            self._waiting[path] = _Waiting(self._stat(path), now, now)
        else:  # the signature as of this hint: a file closed now settles one quiet period from now
            waiting.signature, waiting.quiet_since = self._stat(path), now

    def settled(self, now: float) -> list[str]:
        """The paths quiet for `quiet_s` (same signature as last checked), removed from the waiting
        ones, sorted; the others stay. Stats each path whose quiet period is over."""
        ready = []
        for path, waiting in list(self._waiting.items()):
            if now - waiting.quiet_since < self.quiet_s:
                continue
            current = self._stat(path)
            if current != waiting.signature and now - waiting.first_seen < self.longest_s:
                waiting.signature, waiting.quiet_since = current, now  # still being written
                continue
            ready.append(path)
            del self._waiting[path]
        return sorted(ready)

    def any_present(self) -> bool:
        """Whether a waiting path existed when last seen (a new file, or a move's destination). Safe to
        call from another thread (a pass's prune step): it reads a copy taken at once."""
        return any(w.signature is not None for w in list(self._waiting.values()))

    def next_due(self, now: float) -> float | None:
        """Seconds until the next path may settle (None when nothing waits)."""
        if not self._waiting:
            return None
        return max(0.0, min(w.quiet_since for w in self._waiting.values()) + self.quiet_s - now)
