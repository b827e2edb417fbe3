"""The Rich progress bar of `cnclip index`: items/s, ETA, skipped and failed counts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

if TYPE_CHECKING:
    from indexer.domain.index_summary import IndexSummary


class IndexProgress:
    """Context manager whose `update(summary)` redraws the bar (on stderr, so stdout stays clean)."""

    def __init__(self, collection: str) -> None:
        self._started = time.perf_counter()
        self._progress = Progress(
            TextColumn(f"[bold]{collection}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
            TextColumn("skipped {task.fields[skipped]}  failed {task.fields[failed]}"),
            console=Console(stderr=True),
        )
        self._task = self._progress.add_task("index", total=None, rate="", skipped=0, failed=0)

    def __enter__(self) -> IndexProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def update(self, summary: IndexSummary) -> None:
        elapsed = max(time.perf_counter() - self._started, 1e-6)
        self._progress.update(
            self._task,
            total=summary.total,
            completed=summary.done,
            # No rate until something is embedded: "0.0 items/s" on a run with nothing to embed reads as a stall.
            rate=f"{summary.embedded / elapsed:.1f} items/s" if summary.embedded else "",
            skipped=summary.skipped,
            failed=len(summary.failures),
        )


@contextmanager
def rebuild_progress(collection: str) -> Iterator[Callable[[int, int], None]]:
    """A bar for `cnclip reindex`: yields `update(done, total)`."""
    progress = Progress(
        TextColumn(f"[bold]{collection}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=Console(stderr=True),
    )  # fmt: skip
    task = progress.add_task("reindex", total=None)
    with progress:
        yield lambda done, total: progress.update(task, completed=done, total=total)
