"""A full disk is a fault of its own: `StorageFull` (the API answers 507), raised wherever the storage
layer writes (upload copies, FAISS files, the database) instead of a bare OSError or driver error."""

from __future__ import annotations

import errno

from retrieval.errors import CnclipError

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


class StorageFull(CnclipError):
    """The disk (or the quota) under the data dir or the database is full: nothing was stored."""

    code = "storage_full"


def is_storage_full(exc: OSError) -> bool:
    """ENOSPC or EDQUOT: the write failed for want of space, not for a bug."""
    return exc.errno in _FULL_ERRNOS
