"""A full disk is a fault of its own: `StorageFull` (the API answers 507), raised wherever the storage
layer writes (upload copies, FAISS files, the database) instead of a bare OSError or driver error."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from indexer.errors import StorageFull

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
TEMP_MARK = ".tmp-"  # in every temp file's name: what the start-up media sweep recognises


def is_storage_full(exc: OSError) -> bool:
    """ENOSPC or EDQUOT: the write failed for want of space, not for a bug."""
    return exc.errno in _FULL_ERRNOS


def write_atomically(path: Path, parts: Sequence[bytes | memoryview], what: str) -> None:
    """Write `parts` to `path` through a temp file beside it (fsync, rename), so a reader sees the old
    file or the whole new one; a full disk is `StorageFull` naming `what`, and no temp file is left."""

    def write(f: BinaryIO) -> None:
        for part in parts:
            f.write(part)

    write_atomically_with(path, write, what)


def write_atomically_with(path: Path, write: Callable[[BinaryIO], None], what: str) -> None:
    """`write_atomically` for a body written by `write(file)` (streamed, so never whole in memory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}{TEMP_MARK}{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if is_storage_full(exc):
            size = tmp.stat().st_size if tmp.exists() else 0
            raise StorageFull(f"no space left to {what} {path.name} ({size} bytes written): {exc.strerror}") from exc
        raise
    finally:
        tmp.unlink(missing_ok=True)  # gone already after the rename; a failed write's leftover otherwise
