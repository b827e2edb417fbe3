"""Every file or folder a command writes is checked before the command's work starts: a run of minutes
(`cnclip tune`, `convert`, `bench`, `index`) must not end in "cannot write". One rule for every command.

The checks are the ones a write would fail on, made early: the target is not a folder (for a file), a
FIFO, a device or a socket (writing into a FIFO blocks until a reader comes); the folder it goes into
exists (or, where the command creates it, its nearest existing ancestor is a folder) and a file can be
created there (tried, not guessed from mode bits: ACLs, read-only mounts and root all answer truly).
A folder can still change between this check and the write: the writers report that themselves; this
only spares the user the wait.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import tempfile
from pathlib import Path

import typer

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def check_output_file(path: Path, option: str, *, create_folders: bool = False) -> Path:
    """`path`, once a regular file can be written there (`option` names it in the error, a usage error:
    exit 2). `create_folders`: the command creates missing folders above it (else they must exist)."""
    kind = _kind(path)
    if kind == "a folder":
        raise _bad(option, f"{path} is a folder; name a file")
    if kind not in (None, "a file"):
        raise _bad(option, f"{path} is {kind}, not a regular file")
    _check_folder(path.parent, option, create=create_folders, wanted=path)
    return path


def check_output_folder(path: Path, option: str) -> Path:
    """`path`, once it is a folder a command may write into, or one it can create (with its parents)."""
    kind = _kind(path)
    if kind is not None and kind != "a folder":
        raise _bad(option, f"{path} is {kind}, not a folder")
    _check_folder(path, option, create=True, wanted=path)
    return path


def write_text_atomically(path: Path, text: str, option: str) -> None:
    """Write `text` (UTF-8) to `path` through a temporary file beside it and a rename: never into a FIFO
    put there since the check, never a half-written file. A failure is a usage error naming `option`."""
    tmp: Path | None = None
    try:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        # 0o666 less the umask, as `open(path, "w")` would make it (mkstemp's 0o600 would hide a report).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise _bad(option, f"cannot write {path}: {exc.strerror or exc}") from None


def _kind(path: Path) -> str | None:
    """What `path` is (links followed), or None when nothing is there (a dangling link, or a path through
    a file: "a/b" where a is a file, which the check of the folders above then names)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # too long, a loop of links, no permission to look
        return f"unusable ({exc.strerror or exc})"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a file"
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _check_folder(folder: Path, option: str, *, create: bool, wanted: Path) -> None:
    folder = Path(os.path.abspath(folder))
    existing = folder
    while _kind(existing) is None and existing != existing.parent:
        if not create:
            raise _bad(option, f"the folder {folder} does not exist (create it first, or name another place)")
        existing = existing.parent
    kind = _kind(existing)
    if kind != "a folder":
        raise _bad(option, f"{existing} is {kind}, not a folder, so {wanted} cannot be written")
    try:
        fd, probe = tempfile.mkstemp(prefix=".cnclip-write-check-", dir=existing)
    except OSError as exc:
        raise _bad(option, f"cannot write in {existing} ({exc.strerror or exc}), so not {wanted}") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def _bad(option: str, message: str) -> typer.BadParameter:
    return typer.BadParameter(message, param_hint=option)
