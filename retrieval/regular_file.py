"""Opening a file that a setting, a command-line option or a model directory names: only a regular
file, never blocking, never bigger than its kind can be. Every reader of such a file (the tuning
file, manifest.json, the graphs and their data, the vocabulary, the label sets, the catalog's SQLite
header) goes through here, so the rule is one.

Why: a name is not a file. `open()` of a FIFO waits for a writer (for ever: `cnclip serve` hung
before its first line with `CNCLIP_TUNING_FILE` naming one); a link to `/dev/zero` reads without
end; a sparse file of 8 GiB is hashed for minutes. So a path is first `stat`ed (a device or FIFO
is refused without being opened at all: opening some devices has effects), then opened with
`O_NONBLOCK` (a FIFO swapped in since the `stat` cannot hang the open) and `fstat`ed again — the
descriptor is what is read, and it is a regular file of at most `max_bytes`.

Errors are `UnusableFile` (a `CnclipError`) with one line naming the path and what is wrong with it;
callers that own a more precise error (`ModelError`, `DatabaseRefused`) wrap its `reason`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from retrieval.errors import CnclipError

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


class UnusableFile(CnclipError):
    """A named file that is not read: missing, not a regular file, or too large for what it is.
    `reason` completes "PATH ...", e.g. "is a FIFO, not a regular file"."""

    code = "unusable_file"

    def __init__(self, path: Path | str, reason: str, missing: bool = False) -> None:
        super().__init__(f"{path} {reason}")
        self.path, self.reason, self.missing = Path(path), reason, missing


def kind_of(mode: int) -> str:
    """What a file of this `st_mode` is, in words."""
    for test, word in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return word
    return "not a regular file"


def _checked(path: Path, info: os.stat_result, max_bytes: int | None) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = kind_of(info.st_mode)
        raise UnusableFile(path, f"is {kind}, not a regular file" if kind.startswith("a ") else f"is {kind}")
    if max_bytes is not None and info.st_size > max_bytes:
        raise UnusableFile(path, f"is larger than {_size(max_bytes)}")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


def open_regular(path: Path | str, max_bytes: int | None = None) -> int:
    """A read-only descriptor of the regular file at `path` (links followed) of at most `max_bytes`;
    `UnusableFile` says why not. The caller closes it and reads from it, never from the path again."""
    path = Path(path)
    try:
        _checked(path, os.stat(path), max_bytes)  # refuse a device or FIFO before opening it at all
        fd = os.open(path, _FLAGS)
    except FileNotFoundError as exc:
        raise UnusableFile(path, "is missing", missing=True) from exc
    except OSError as exc:
        raise UnusableFile(path, f"cannot be read ({exc.strerror or exc})") from exc
    try:
        _checked(path, os.fstat(fd), max_bytes)  # what was opened, whatever the path names by now
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_regular(path: Path | str, max_bytes: int | None = None) -> int:
    """The size of the regular file at `path` (see `open_regular`); `UnusableFile` when it is not one."""
    fd = open_regular(path, max_bytes)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_regular(path: Path | str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` (a file that grows past it while
    read is refused too)."""
    fd = open_regular(path, max_bytes)
    with os.fdopen(fd, "rb") as handle:
        try:  # a regular file can still refuse to be read: /proc/self/mem (EIO), a file on a failing disk
            data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise UnusableFile(path, f"cannot be read ({exc.strerror or exc})") from exc
    if data is None:  # nothing to read yet on a non-blocking descriptor (/proc/kmsg): it would wait
        raise UnusableFile(path, "cannot be read without waiting (it is no file of data)")
    if len(data) > max_bytes:
        raise UnusableFile(path, f"is larger than {_size(max_bytes)} (it grew while read)")
    return data


def folder_problem(path: Path | str) -> str | None:
    """Why the folder a setting names (made when missing) cannot be used, completing "PATH ...", or None
    when it is a folder or can be made. Every way a name fails is one line, never an `OSError` from a
    later `mkdir`: bytes that are not UTF-8, a name too long, a loop of links, a link to nothing, a
    file in the way (of the folder or of one of its parents)."""
    path = Path(path)
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        return "is not UTF-8 text"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        ancestor = path
        while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if ancestor == path:
            return "is a symbolic link to nothing"
        if not os.path.isdir(ancestor):
            return f"cannot be made: {ancestor} is not a folder"
        return None
    except OSError as exc:
        return f"cannot be used ({exc.strerror or exc})"
    return None if stat.S_ISDIR(info.st_mode) else "is not a folder"


def read_regular_text(path: Path | str, max_bytes: int, what: str = "file") -> str:
    """`read_regular` decoded as UTF-8; `UnusableFile` for bytes that are not UTF-8."""
    try:
        return read_regular(path, max_bytes).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnusableFile(path, f"is not UTF-8 text (byte {exc.start}); it is no {what}") from None
