"""Giving back the pages of weight files a compiled model no longer reads (Linux).

OpenVINO maps a graph's external weight file (`image.fp32.data`) into the process and reads every
page of it while compiling; the compiled model then computes from its own re-laid copy, but keeps
the mapping (it keeps the original constants), so the pages it read stay resident beside that copy:
399 of OpenVINO bf16's 728 MB for the ViT-B-16 image tower on an AMX Xeon (BENCHMARKS.md, issue 34).

The mapping is shared and read-only, so its pages are the page cache's, not the process's: dropping
them from the process (`madvise(MADV_DONTNEED)`) loses nothing — a later read faults the same bytes
back from the file (a constant used in place, say a text embedding, faults back only the rows it
reads). Private or writable mappings are never touched: their pages may hold what the file does not.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

MADV_DONTNEED = 4  # linux/mman.h


def shared_read_only_maps(folders: Iterable[Path], maps: str = "/proc/self/maps") -> list[tuple[int, int, Path]]:
    """(start, end, file) of this process's shared read-only mappings of files directly in `folders`."""
    wanted = {os.path.realpath(f) for f in folders}
    found = []
    try:
        with open(maps, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.readlines()
    except OSError:
        return []
    for line in lines:
        # address perms offset dev inode pathname (the pathname may hold spaces; a deleted file says so)
        fields = line.rstrip("\n").split(maxsplit=5)
        if len(fields) < 6 or fields[1] != "r--s" or not fields[5].startswith("/"):
            continue
        path = Path(fields[5])
        if os.path.dirname(fields[5]) not in wanted:
            continue
        start, end = (int(edge, 16) for edge in fields[0].split("-"))
        found.append((start, end, path))
    return found


def release_resident(folders: Iterable[Path]) -> int:
    """Drop this process's resident pages of shared read-only mappings of files in `folders`; the
    bytes released from its address space (0 where the system has no /proc or madvise)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = _libc()
    released = 0
    for start, end, path in shared_read_only_maps(folders):
        if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_DONTNEED) != 0:
            log.debug("madvise(%s) failed: %s", path, os.strerror(ctypes.get_errno()))
            continue
        released += end - start
    return released


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return libc
