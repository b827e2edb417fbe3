"""`cnclip ocr` (registered by cli/indexing.py, beside `cnclip index`): read the text in the photos of an image collection that has none yet (docs/ocr.md),
without embedding anything; it turns the collection's OCR on, so later runs, uploads and watchers read
theirs. Resumable: each batch is stored as it is read, so a stopped run (Ctrl-C, a kill, `--limit`)
goes on where it ended. Exit status as `cnclip index`: 3 when some photos could not be read (their
files gone or changed), 130 when interrupted."""

from __future__ import annotations

import asyncio
import json
import signal
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cli.catalog import storage_settings
from cli.errors import EXIT_FILES_FAILED, EXIT_INTERRUPTED
from cli.output import plural

if TYPE_CHECKING:
    from indexer.config import StorageSettings
    from indexer.service.texts import TextFill

SHOWN_UNREADABLE = 20  # photos listed on the terminal; --json counts them all


def ocr(
    collection: Annotated[str, typer.Option("--collection", "-c", help="Image collection to read.")],
    limit: Annotated[int | None, typer.Option(min=1, help="Read at most this many photos, then stop.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON line.")] = False,
) -> None:
    """Read the text in the collection's photos that have none yet, and keep OCR on for it."""
    from indexer.domain.names import check_collection_name

    check_collection_name(collection)
    fill = asyncio.run(_fill(storage_settings(), collection, limit, show_progress=not as_json))
    if as_json:
        typer.echo(json.dumps(fill.as_json(), ensure_ascii=False))
    else:
        rate = f", {fill.read / fill.seconds:.2f} photos/s" if fill.seconds > 0 and fill.read else ""
        typer.echo(
            f"{fill.collection}: {plural(fill.read, 'photo')} read ({fill.with_text} with text) in {fill.seconds:.1f}s"
            f"{rate}; {fill.missing - fill.read - len(fill.unreadable)} still to read"
        )
        for item_id, why in fill.unreadable[:SHOWN_UNREADABLE]:
            typer.echo(f"  not read: item {item_id}: {why}")
    if fill.interrupted:
        if not as_json:
            typer.echo("interrupted: what was read is kept; run the same command again to resume")
        raise typer.Exit(EXIT_INTERRUPTED)
    if fill.unreadable:
        raise typer.Exit(EXIT_FILES_FAILED)


async def _fill(settings: StorageSettings, collection: str, limit: int | None, *, show_progress: bool) -> TextFill:
    from indexer.runtime import open_runtime

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    progress = Progress(
        TextColumn(f"[bold]{collection}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not show_progress,
    )
    task = progress.add_task("ocr", total=None)

    def on_progress(fill: TextFill) -> None:
        progress.update(task, total=fill.missing if limit is None else min(limit, fill.missing), completed=fill.read)

    # No model: the text is read from the files, nothing is embedded; no vector store is opened.
    async with open_runtime(settings, encoder=False, warm=False) as rt:
        assert rt.service is not None
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        try:
            with progress:
                return await rt.service.texts.fill(collection, stop=stop, limit=limit, on_progress=on_progress)
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            loop.remove_signal_handler(signal.SIGTERM)
