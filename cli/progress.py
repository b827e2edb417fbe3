"""What the terminal shows of an indexing run: the Rich progress bar of `cnclip index` (items/s, ETA,
skipped and failed counts) and the summary line of a pass, which `cnclip index` and `cnclip watch` print."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cli.output import plural

if TYPE_CHECKING:
    from indexer.domain.index_summary import IndexSummary

SHOWN_FAILURES = 20  # bad files printed on the terminal; the report file has all of them


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


def stage_line(summary: IndexSummary) -> str:
    """Where the run's time went (docs/indexing.md, "Stage times"); stages overlap, so they may add up
    to more than the wall time."""
    times = summary.stages
    ocr = f", ocr {times.ocr_s:.1f}" if times.ocr_s else ""
    waited = f" (+{times.core_wait_s:.1f} waiting for a core)" if times.core_wait_s >= 0.05 else ""
    return (
        f"stages (s, overlapping): walk {times.walk_s:.1f}, read {times.read_s:.1f}, "
        f"decode {times.decode_s:.1f}{waited}, encode {times.encode_s:.1f}, commit {times.commit_s:.1f}, "
        f"vectors {times.vectors_s:.1f}{ocr}; wall {times.wall_s:.1f}"
    )


def print_summary(summary: IndexSummary, dry_run: bool) -> None:
    """The summary line of a pass (`cnclip index`, the first pass of `cnclip watch`) and its first bad files."""
    from indexer.fs.file_names import printable

    if dry_run:
        typer.echo(
            f"dry run: {plural(summary.would_index, 'image')} to embed, {summary.would_date} to date, "
            f"{summary.unchanged} unchanged, {plural(summary.duplicates, 'duplicate')}, {summary.renamed} renamed, "
            f"{plural(summary.would_prune, 'row')} to prune, {len(summary.failures)} unreadable"
        )
    else:
        # A rate only when something was embedded: "0.0 images/s" for a run with nothing to do reads as a stall.
        rate = f", {summary.embedded / summary.seconds:.1f} images/s" if summary.embedded and summary.seconds else ""
        dated = f"; dated {summary.dated}" if summary.dated else ""
        dated += f"; hashed {summary.hashed}" if summary.hashed else ""
        dated += f"; read for text {summary.read_for_text}" if summary.read_for_text else ""
        companions = f", RAW beside JPEG {summary.raw_companions}" if summary.raw_companions else ""
        typer.echo(
            f"indexed {summary.added} new, {summary.changed} changed, {summary.renamed} renamed; "
            f"skipped {summary.skipped} (unchanged {summary.unchanged}, duplicates {summary.duplicates}, "
            f"not images {summary.not_images}, deleted earlier {summary.deleted_before}{companions}); "
            f"failed {len(summary.failures)}; "
            f"pruned {summary.pruned}{dated}; {summary.seconds:.1f} s{rate}"
        )
        if summary.embedded and summary.stages.wall_s:
            typer.echo(stage_line(summary))
    for where, why in summary.failures[:SHOWN_FAILURES]:
        typer.echo(f"  bad: {printable(where)}: {printable(why)}")
    if len(summary.failures) > SHOWN_FAILURES:
        typer.echo(f"  … and {len(summary.failures) - SHOWN_FAILURES} more")
