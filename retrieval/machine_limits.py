"""How many threads a setting or a tuning file may start: bounded by the cores this process may run
on (`os.sched_getaffinity`, which a container's CPU set or `taskset` narrows). The one rule for
`CNCLIP_STREAMS`, `CNCLIP_THREADS_PER_STREAM`, `CNCLIP_INDEX_READ_THREADS` and a tuning file's
`streams` / `threads_per_stream`.

Why: the tuning file's schema allowed `threads_per_stream` 4096; a file with it started 4,613
threads and drove the load average to 295. More inference threads than cores never runs faster
(they take turns on the same cores and spin while they wait), so a tower's streams × threads per
stream may not exceed the cores. Reading files waits on the disk more than on a core, so readers may
be `IO_THREADS_PER_CORE` times the cores. Memory is bounded apart: every stream's weight copies
count against `CNCLIP_MEMORY_BUDGET_MB` (retrieval/memory_budget.py).
"""

from __future__ import annotations

import os

IO_THREADS_PER_CORE = 4


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def inference_threads_refusal(streams: int, threads_per_stream: int, cores: int | None = None) -> str | None:
    """Why `streams` sessions of `threads_per_stream` intra-op threads each (0: an equal share of the
    cores) cannot run here, in words; None when they can."""
    cores = cores or usable_cores()
    if streams > cores:
        return f"{streams} streams, but this process may run on {cores} cores (at most {cores} streams)"
    if streams * max(threads_per_stream, 1) > cores:
        return (
            f"{streams} stream(s) × {threads_per_stream} threads = {streams * threads_per_stream} threads, but this "
            f"process may run on {cores} cores (threads_per_stream 0 shares them out)"
        )
    return None


def io_threads_refusal(threads: int, cores: int | None = None) -> str | None:
    """Why `threads` file-reading threads are too many here; None when they are not."""
    most = IO_THREADS_PER_CORE * (cores or usable_cores())
    if threads > most:
        return f"{threads} threads, but at most {most} ({IO_THREADS_PER_CORE} per core this process may run on)"
    return None
