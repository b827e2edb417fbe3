"""`cnclip index PATH --collection NAME --watch`: the first pass with the progress bar and the summary
line of `cnclip index`, then one line per pass that changed something, until Ctrl-C or SIGTERM (the
batches in flight finish; exit status 0). Ctrl-C during the first pass is `cnclip index`'s: 130, and
the same command resumes. The watcher itself is indexer/watch/watcher.py."""

from __future__ import annotations

import asyncio
import signal
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cli.errors import EXIT_INTERRUPTED
from cli.progress import IndexProgress, print_summary

if TYPE_CHECKING:
    from indexer.config import StorageSettings
    from indexer.domain.index_summary import IndexSummary
    from indexer.watch.watcher import FolderWatcher

WatchFlags = tuple[bool, bool, float | None, bool]  # --watch, --dry-run, --rescan-interval, --poll


def watch_folder(
    settings: StorageSettings, source: Path, collection: str, options: dict[str, Any], flags: WatchFlags
) -> int:
    """Check the watch options (one line and status 1 when they do not fit), then watch; the exit status."""
    from retrieval.errors import InvalidInput

    watch, dry_run, rescan_interval, poll = flags
    if not watch:
        raise InvalidInput("--rescan-interval and --poll go with --watch")
    if dry_run:
        raise InvalidInput("--watch and --dry-run do not go together (a dry run writes nothing to keep up to date)")
    if not source.is_dir():
        raise InvalidInput(f"{source} is not a folder: --watch watches a folder, not a manifest")
    return asyncio.run(_watch(settings, source, collection, options, rescan_interval, poll))


async def _watch(
    settings: StorageSettings,
    source: Path,
    collection: str,
    options: dict[str, Any],
    rescan_interval: float | None,
    poll: bool,
) -> int:
    from indexer.bulk.pipeline import ImageIndexer
    from indexer.runtime import open_runtime
    from indexer.watch.watcher import FolderWatcher, WatchOptions

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        # The first Ctrl-C (or SIGTERM) finishes the batches in flight; a second Ctrl-C aborts at once.
        typer.echo("\nstopping after the batches in flight (Ctrl-C again to abort)…", err=True)
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    watch_options = WatchOptions.from_settings(
        settings, rescan_interval_s=rescan_interval, events="poll" if poll else None
    )
    with ExitStack() as bar:
        printer = PassPrinter(source, bar)
        async with open_runtime(settings, sweep_media=True, warm=False) as rt:
            assert rt.service is not None
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, on_signal)
            try:
                await asyncio.to_thread(rt.service.ensure, collection, "images", options.pop("index_factory"))
                if options.pop("ocr", False):  # --ocr: the collection's from now on (docs/ocr.md)
                    await asyncio.to_thread(rt.service.texts.set_ocr, collection, True)
                await rt.start_encoders()  # after the checks: a wrong collection fails before the model loads
                printer.watcher = FolderWatcher(
                    rt.service,
                    collection,
                    source,
                    watch_options,
                    settings.data_dir,
                    on_pass=printer,
                    pipeline=ImageIndexer.from_settings(settings, rt.service, collection, **options),
                )

                def progress(summary: IndexSummary) -> None:
                    # The bar appears with the first pass (not while a second watcher stands by).
                    if printer.bar_shown is None:
                        printer.bar_shown = bar.enter_context(IndexProgress(collection))
                    printer.bar_shown.update(summary)

                first = await printer.watcher.run(stop, progress)
            finally:
                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(signum)
    if first is not None and first.interrupted:
        typer.echo("interrupted: everything committed is kept; run the same command again to resume")
        return EXIT_INTERRUPTED
    return 0


class PassPrinter:
    """What the terminal shows of each pass: the first one as `cnclip index` does (its progress bar
    closed first), then one line per pass that changed something."""

    def __init__(self, source: Path, bar: ExitStack) -> None:
        self.source = source
        self.bar = bar
        self.watcher: FolderWatcher | None = None
        self.bar_shown: IndexProgress | None = None

    def __call__(self, kind: str, summary: IndexSummary) -> None:
        if kind == "first":
            self.bar.close()
            print_summary(summary, False)
            if not summary.interrupted:
                mode = self.watcher.mode if self.watcher is not None else "?"
                typer.echo(f"watching {self.source} ({mode}; Ctrl-C to stop)")
        elif summary.added or summary.changed or summary.renamed or summary.pruned or summary.failures:
            typer.echo(
                f"{datetime.now():%H:%M:%S} {summary.added} new, {summary.changed} changed, "
                f"{summary.renamed} renamed, {summary.pruned} pruned, {len(summary.failures)} failed"
            )
