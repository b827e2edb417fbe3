"""`cnclip index` and `cnclip index-texts`: the bulk indexer (indexer/bulk/pipeline.py) and the text
loader (indexer/bulk/texts.py) from the shell, with a progress bar, a summary line and a report of bad
files. Neither opens a vector store before its final flush: a server running meanwhile catches its
engine up from SQL by itself (also one that holds a Milvus Lite file)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.catalog import storage_settings
from cli.errors import EXIT_FILES_FAILED, EXIT_INTERRUPTED, friendly_errors
from cli.output import plural
from cli.output_paths import check_output_file, write_text_atomically

if TYPE_CHECKING:
    from indexer.config import StorageSettings
    from indexer.domain.index_summary import IndexSummary

SHOWN_FAILURES = 20  # bad files printed on the terminal; the report file has all of them
INDEX_HELP = (
    "Index for a new collection: Flat, HNSW{M}, IVF{n},Flat or IVF{n},PQ{m}[x{bits}] (default CNCLIP_INDEX_FACTORY)."
)


def register(app: typer.Typer) -> None:
    """`cnclip index` and `cnclip index-texts`."""
    app.command("index")(friendly_errors(index))
    app.command("index-texts")(friendly_errors(index_texts))


def index(
    source: Annotated[Path, typer.Argument(help="A folder (walked recursively) or a .jsonl/.csv manifest.")],
    collection: Annotated[str, typer.Option("--collection", "-c", help="Image collection to index into.")],
    prune: Annotated[bool, typer.Option(help="Remove rows whose files no longer exist.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would be done.")] = False,
    report: Annotated[Path | None, typer.Option(help="Where to write bad files (JSONL).")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Images per batch (default CNCLIP_INDEX_BATCH_SIZE).")] = None,
    index_factory: Annotated[str | None, typer.Option("--index", help=INDEX_HELP)] = None,
    restore_deleted: Annotated[
        bool, typer.Option("--restore-deleted", help="Index again the files whose items a user deleted.")
    ] = False,
    watch: Annotated[
        bool, typer.Option("--watch", help="Keep running: index what changes in the folder (see docs/indexing.md).")
    ] = False,
    rescan_interval: Annotated[
        float | None,
        typer.Option(
            min=1, max=86_400, help="--watch: seconds between full rescans (default CNCLIP_WATCH_RESCAN_INTERVAL_S)."
        ),
    ] = None,
    poll: Annotated[bool, typer.Option("--poll", help="--watch: poll the folder instead of inotify events.")] = False,
) -> None:
    """Index the images of a folder or manifest: incremental, resumable, bad files reported
    (exit status 3 when some failed). Items deleted by a user stay deleted unless --restore-deleted.
    Files indexed before photo dates existed get theirs (EXIF or mtime) without being embedded again."""
    from indexer.domain.index_spec import parse_index
    from indexer.domain.names import check_collection_name
    from retrieval.errors import InvalidInput

    check_collection_name(collection)
    if not source.exists():  # before the catalog, the model and the progress bar
        raise InvalidInput(f"{source} does not exist")
    if batch_size is not None and batch_size < 1:
        raise InvalidInput("--batch-size must be at least 1")
    if report is not None:  # before the run, not after it
        check_output_file(report, "--report", create_folders=True)
    if index_factory is not None:  # the grammar, before anything opens (the dimension: when it is created)
        index_factory = parse_index(index_factory).description
    settings = storage_settings()
    options = {"batch_size": batch_size or settings.index_batch_size, "index_factory": index_factory}
    if watch or rescan_interval is not None or poll:
        from cli.watching import watch_folder

        options["restore_deleted"] = restore_deleted
        raise typer.Exit(watch_folder(settings, source, collection, options, (watch, dry_run, rescan_interval, poll)))
    summary = asyncio.run(_index(settings, source, collection, prune, dry_run, restore_deleted, options))
    _print_summary(summary, dry_run)
    if summary.failures:
        path = report or settings.data_dir / "reports" / f"index-{collection}-{_stamp()}.jsonl"
        _write_report(path, summary.failures)
        typer.echo(f"bad files: {path}")
    if summary.interrupted:
        typer.echo("interrupted: everything committed is kept; run the same command again to resume")
        raise typer.Exit(EXIT_INTERRUPTED)
    if summary.failures:
        raise typer.Exit(EXIT_FILES_FAILED)


async def _index(
    settings: StorageSettings,
    source: Path,
    collection: str,
    prune: bool,
    dry_run: bool,
    restore_deleted: bool,
    options: dict[str, Any],
) -> IndexSummary:
    from cli.progress import IndexProgress
    from indexer.bulk.pipeline import ImageIndexer
    from indexer.runtime import open_runtime

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_sigint() -> None:
        # First Ctrl-C: finish the batches in flight and stop. A second one aborts at once.
        typer.echo("\nstopping after the batches in flight (Ctrl-C again to abort)…", err=True)
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    # A writer: no vector store is opened before the final flush; the model loads after the checks.
    async with open_runtime(settings, sweep_media=True, warm=False) as rt:
        assert rt.service is not None
        loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            await asyncio.to_thread(_check_target, rt.service, collection, dry_run, options["index_factory"])
            if not dry_run:  # a dry run decodes images without the model (indexer/bulk/pipeline.py)
                await rt.start_encoders()
            indexer = ImageIndexer(
                rt.service,
                collection,
                read_threads=settings.index_read_threads,
                inflight=max(2, settings.streams + 1),
                restore_deleted=restore_deleted,
                exclude=[settings.data_dir],  # its uploads' copies and thumbnails are not the folder's photos
                **options,
            )
            with IndexProgress(collection) as progress:
                return await indexer.run(source, prune=prune, dry_run=dry_run, stop=stop, on_progress=progress.update)
        finally:
            loop.remove_signal_handler(signal.SIGINT)


def _check_target(service: Any, collection: str, dry_run: bool, index_factory: str | None) -> None:
    """Kind and model, before the model loads (a dry run checks an existing collection only: a
    missing one is what a real run would create)."""
    from retrieval.errors import NotFound

    if not dry_run:
        service.ensure(collection, "images", index_factory)
        return
    with contextlib.suppress(NotFound):
        service.writable(collection, "images")


def index_texts(
    file: Annotated[Path, typer.Argument(help="One text per line, or JSONL with {text, tags, extra}.")],
    collection: Annotated[str, typer.Option("--collection", "-c", help="Text collection to fill.")],
) -> None:
    """Build a text collection (captions, tags) for image → text search."""
    from indexer.bulk.texts import read_texts
    from indexer.domain.names import check_collection_name
    from retrieval.errors import InvalidInput

    check_collection_name(collection)
    if not file.is_file():
        raise InvalidInput(f"{file} is not a file")
    settings = storage_settings()
    texts = read_texts(file)
    added, existing = asyncio.run(_index_texts(settings, collection, texts))
    typer.echo(f"{collection}: {plural(added, 'text')} added, {existing} already there")


async def _index_texts(settings: StorageSettings, collection: str, texts: list[Any]) -> tuple[int, int]:
    from indexer.bulk.texts import index_texts as add_texts
    from indexer.runtime import open_runtime

    async with open_runtime(settings, warm=False) as rt:
        assert rt.service is not None
        await asyncio.to_thread(rt.service.ensure, collection, "texts")  # before the model loads
        await rt.start_encoders()
        return await add_texts(rt.service, collection, texts, batch_size=max(settings.buckets))


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def _write_report(path: Path, failures: list[tuple[str, str]]) -> None:
    from indexer.fs.file_names import printable

    path.parent.mkdir(parents=True, exist_ok=True)
    # A name with undecodable bytes is shown as `\\xNN`: the report is UTF-8 text.
    lines = (
        json.dumps({"path": printable(where), "reason": printable(why)}, ensure_ascii=False) for where, why in failures
    )
    write_text_atomically(path, "".join(line + "\n" for line in lines), "--report")


def _print_summary(summary: IndexSummary, dry_run: bool) -> None:
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
        companions = f", RAW beside JPEG {summary.raw_companions}" if summary.raw_companions else ""
        typer.echo(
            f"indexed {summary.added} new, {summary.changed} changed, {summary.renamed} renamed; "
            f"skipped {summary.skipped} (unchanged {summary.unchanged}, duplicates {summary.duplicates}, "
            f"not images {summary.not_images}, deleted earlier {summary.deleted_before}{companions}); "
            f"failed {len(summary.failures)}; "
            f"pruned {summary.pruned}{dated}; {summary.seconds:.1f} s{rate}"
        )
    for where, why in summary.failures[:SHOWN_FAILURES]:
        typer.echo(f"  bad: {printable(where)}: {printable(why)}")
    if len(summary.failures) > SHOWN_FAILURES:
        typer.echo(f"  … and {len(summary.failures) - SHOWN_FAILURES} more")
