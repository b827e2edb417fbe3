"""Give large freed buffers back to the operating system at once (glibc's malloc).

A decoded 50 MP image is 150 MB, a KServe v2 body up to 64 MB. glibc serves allocations over its mmap
threshold with their own mappings, returned on free, but it *raises* that threshold to the size of each
such block freed (up to 32 MiB), so from the second large image on, the buffers come from the worker
threads' malloc arenas, which keep them: four 7000×7000 PNGs embedded in parallel left the server
390 MB bigger for good. Fixing the threshold at 1 MiB (which also turns the raising off) keeps every
large buffer a mapping of its own: measured here, +2 MB after the same requests and no slower (a page
fault per 4 KiB of a fresh large buffer, against milliseconds of decoding or inference per image).
`MALLOC_MMAP_THRESHOLD_` in the environment, or another C library, leaves the process as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger("cnclip.runtime")

MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)


def return_large_frees_to_os(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes for this process; True when it was set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False  # the operator's own choice
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, threshold))
    if not done:
        log.warning("could not set malloc's mmap threshold; large freed buffers may stay in the process")
    return done


def trim_heap() -> bool:
    """Hand the free pages of glibc's heaps back to the operating system (`malloc_trim(0)`): after a
    set of sessions is closed, so the next one's resident growth is its own and not a reuse of the
    last one's pages; True when glibc did so."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        malloc_trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return False
    malloc_trim.argtypes = (ctypes.c_size_t,)
    malloc_trim.restype = ctypes.c_int
    return bool(malloc_trim(0))
