"""Backfills of unchanged files indexed before a column existed (the photo's date, the perceptual hash):
read each file's value in reader threads and store it in chunks, with no embedding. A file that cannot
be read now keeps no value until the next run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from indexer.bulk.sources import SourceEntry
from indexer.domain.records import FileState


def backfill(
    entries: Sequence[SourceEntry],
    states: dict[str, FileState],
    read: Callable[[SourceEntry], Any],
    store: Callable[[list[tuple[Any, ...]]], None],
    threads: int,
    name: str,
    chunk: int = 500,
) -> int:
    """Rows `(item id, *value)` for the entries whose value could be read, stored `chunk` at a time;
    returns how many were stored."""
    with ThreadPoolExecutor(threads, thread_name_prefix=f"cnclip-{name}") as pool:
        rows = [
            (states[str(entry.path)].id, *(value if isinstance(value, tuple) else (value,)))
            for entry, value in zip(entries, pool.map(read, entries), strict=True)
            if value is not None and str(entry.path) in states
        ]
    for start in range(0, len(rows), chunk):
        store(rows[start : start + chunk])
    return len(rows)
