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
from cli.cluster_indexing import cluster_options  # Ray itself only once a run asks for it
from cli.errors import EXIT_FILES_FAILED, EXIT_INTERRUPTED, friendly_errors
from cli.ocr import ocr as ocr_command
from cli.output import plural
from cli.output_paths import check_output_file, write_text_atomically
from cli.progress import IndexProgress, print_summary

if TYPE_CHECKING:
    from indexer.config import StorageSettings
    from indexer.domain.index_summary import IndexSummary
    from indexer.domain.records import CollectionState
    from indexer.service.collections import CollectionService

RAY_HELP = "Read and embed on the Ray cluster at ADDRESS: auto or host:port (docs/scaling-out.md)."
SHARD_THRESHOLD_HELP = "--ray: above this many files to read, commit through Parquet shards (default 50000)."
SHARD_ROWS_HELP = "--ray: rows per Parquet shard (default 10000)."
INDEX_HELP = (
    "Index for a new collection: Auto, Flat, HNSW{M}, IVF{n},Flat or IVF{n},PQ{m}[x{bits}] (default "
    "CNCLIP_INDEX_FACTORY: Auto, Flat then IVF as it grows)."
)


def register(app: typer.Typer) -> None:
    """`cnclip index`, `cnclip index-texts` and `cnclip ocr` (cli/ocr.py)."""
    app.command("index")(friendly_errors(index))
    app.command("index-texts")(friendly_errors(index_texts))
    app.command("ocr")(friendly_errors(ocr_command))


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
    ray: Annotated[str | None, typer.Option("--ray", metavar="ADDRESS", help=RAY_HELP)] = None,
    shard_threshold: Annotated[int | None, typer.Option(min=0, help=SHARD_THRESHOLD_HELP)] = None,
    shard_rows: Annotated[int | None, typer.Option(min=1, help=SHARD_ROWS_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON line.")] = False,
    ocr: Annotated[bool, typer.Option("--ocr", help="Read the text in the photos, also in later runs.")] = False,
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
    options = {"batch_size": batch_size or settings.index_batch_size, "index_factory": index_factory, "ocr": ocr}
    watching = watch or rescan_interval is not None or poll
    if ray is not None or shard_threshold is not None or shard_rows is not None:  # before the catalog and the bar
        options |= cluster_options(ray, watching=watching, shards=(shard_threshold, shard_rows))
    if watching:
        from cli.watching import watch_folder

        options["restore_deleted"] = restore_deleted
        raise typer.Exit(watch_folder(settings, source, collection, options, (watch, dry_run, rescan_interval, poll)))
    summary, details = asyncio.run(_index(settings, source, collection, prune, dry_run, restore_deleted, options))
    bad_files = None
    if summary.failures:
        bad_files = report or settings.data_dir / "reports" / f"index-{collection}-{_stamp()}.jsonl"
        _write_report(bad_files, summary.failures)
    _say_how_it_went(summary, details, bad_files, dry_run, as_json)


def _say_how_it_went(
    summary: IndexSummary, details: dict[str, Any], bad_files: Path | None, dry_run: bool, as_json: bool
) -> None:
    """The summary (a line of text, or with --json one JSON line) and the exit status of a run."""
    if as_json:  # one line on stdout, the report's path in it
        from cli.cluster_indexing import json_summary

        typer.echo(json_summary(summary, details, bad_files))
    else:
        print_summary(summary, dry_run)
        if bad_files is not None:
            typer.echo(f"bad files: {bad_files}")
    if summary.interrupted:
        if not as_json:
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
) -> tuple[IndexSummary, dict[str, Any]]:
    """The run's summary and what each node embedded (`--ray`; a local run is one node)."""
    from cli.cluster_indexing import indexer_class, run_details
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
            checks = (rt.service, collection, dry_run, options["index_factory"], options.pop("ocr"))
            target = await asyncio.to_thread(_check_target, *checks)
            # A dry run decodes images without the model (indexer/bulk/pipeline.py); --ray loads it on the nodes.
            if not dry_run and "address" not in options:
                await rt.start_encoders()
            indexer = indexer_class(options).from_settings(
                settings,
                rt.service,
                collection,
                restore_deleted=restore_deleted,
                exclude=[settings.data_dir],  # its uploads' copies and thumbnails are not the folder's photos
                **options,
            )
            with IndexProgress(collection) as progress:
                summary = await indexer.run(
                    source, prune=prune, dry_run=dry_run, stop=stop, on_progress=progress.update, target=target
                )
            return summary, run_details(indexer, summary)
        finally:
            loop.remove_signal_handler(signal.SIGINT)


def _check_target(
    service: CollectionService, collection: str, dry_run: bool, index_factory: str | None, ocr: bool = False
) -> CollectionState | None:
    """Kind and model, before the model loads: the collection a real run indexes into, created when
    missing (with `ocr`, its OCR turned on) and passed to the pipeline (not read again). A dry run
    checks an existing collection only: a missing one is what a real run would create."""
    from retrieval.errors import NotFound

    if not dry_run:
        target = service.ensure(collection, "images", index_factory)
        return service.texts.set_ocr(collection, True) if ocr and not target.ocr else target
    with contextlib.suppress(NotFound):
        service.resolver.writable(collection, "images")
    return None


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
