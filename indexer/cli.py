"""CLI commands of this package (see api/cli.py): db upgrade, index, index-texts, stats, search."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from indexer.duplicate_pages import MAX_LIMIT, MAX_OFFSET, MIN_THRESHOLD
from indexer.paging import MAX_CANDIDATES, MAX_PAGE, SortOrder

if TYPE_CHECKING:
    from indexer.config import StorageSettings
    from indexer.paging import PageRequest
    from indexer.pipeline import IndexSummary

F = TypeVar("F", bound=Callable[..., Any])


class Sort(StrEnum):
    """`cnclip search --sort` (indexer/paging.py SortOrder): a choice, so a typo is a usage error (2)."""

    relevance = "relevance"
    taken = "taken"
    added = "added"

    @property
    def order(self) -> SortOrder:
        return self.value  # type: ignore[return-value]


class DuplicateTier(StrEnum):
    """`cnclip duplicates --tier` (indexer/duplicate_pages.py TIER_CHOICES)."""

    all = "all"
    identical = "identical"
    resized = "resized"
    similar = "similar"


EXIT_INTERRUPTED = 130
EXIT_FILES_FAILED = 3  # the run finished, but some files could not be indexed (api/cli.py EXIT_STATUS)
SHOWN_FAILURES = 20  # bad files printed on the terminal; the report file has all of them


def _friendly_errors(command: F) -> F:
    """Project errors become one red line and exit status 1, never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from retrieval.errors import CnclipError

        try:
            return command(*args, **kwargs)
        except CnclipError as exc:
            typer.secho(f"error: {exc.message}", fg=typer.colors.RED, err=True)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _settings() -> StorageSettings:
    from indexer.config import StorageSettings

    return StorageSettings()


def register(app: typer.Typer) -> None:
    """Add this package's commands to the `cnclip` app."""
    db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
    app.add_typer(db_app, name="db")

    @db_app.command("upgrade")
    @_friendly_errors
    def db_upgrade() -> None:
        """Create or migrate the catalog database (SQLite file or CNCLIP_DATABASE_URL) to the newest schema."""
        from indexer.db import upgrade_settings_db

        settings = _settings()
        revision = upgrade_settings_db(settings)
        typer.echo(f"database at schema revision {revision}")

    @app.command("index")
    @_friendly_errors
    def index(
        source: Annotated[Path, typer.Argument(help="A folder (walked recursively) or a .jsonl/.csv manifest.")],
        collection: Annotated[str, typer.Option("--collection", "-c", help="Image collection to index into.")],
        prune: Annotated[bool, typer.Option(help="Remove rows whose files no longer exist.")] = False,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would be done.")] = False,
        report: Annotated[Path | None, typer.Option(help="Where to write bad files (JSONL).")] = None,
        batch_size: Annotated[
            int | None, typer.Option(help="Images per batch (default CNCLIP_INDEX_BATCH_SIZE).")
        ] = None,
        index_factory: Annotated[
            str | None,
            typer.Option(
                "--index",
                help="Index for a new collection: Flat, HNSW{M}, IVF{n},Flat or IVF{n},PQ{m}[x{bits}] "
                "(default CNCLIP_INDEX_FACTORY).",
            ),
        ] = None,
        restore_deleted: Annotated[
            bool,
            typer.Option("--restore-deleted", help="Index again the files whose items a user deleted."),
        ] = False,
    ) -> None:
        """Index the images of a folder or manifest: incremental, resumable, bad files reported
        (exit status 3 when some failed). Items deleted by a user stay deleted unless --restore-deleted.
        Files indexed before photo dates existed get theirs (EXIF or mtime) without being embedded again."""
        from indexer.index_spec import parse_index
        from indexer.names import check_collection_name
        from retrieval.errors import InvalidInput

        check_collection_name(collection)
        if not source.exists():  # before the catalog, the model and the progress bar
            raise InvalidInput(f"{source} does not exist")
        if batch_size is not None and batch_size < 1:
            raise InvalidInput("--batch-size must be at least 1")
        if index_factory is not None:  # the grammar, before anything opens (the dimension: when it is created)
            index_factory = parse_index(index_factory).description
        settings = _settings()
        summary = asyncio.run(
            _index(settings, source, collection, prune, dry_run, batch_size, index_factory, restore_deleted)
        )
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

    @app.command("index-texts")
    @_friendly_errors
    def index_texts(
        file: Annotated[Path, typer.Argument(help="One text per line, or JSONL with {text, tags, extra}.")],
        collection: Annotated[str, typer.Option("--collection", "-c", help="Text collection to fill.")],
    ) -> None:
        """Build a text collection (captions, tags) for image → text search."""
        from indexer.names import check_collection_name
        from indexer.texts import read_texts

        check_collection_name(collection)
        if not file.is_file():
            from retrieval.errors import InvalidInput

            raise InvalidInput(f"{file} is not a file")
        settings = _settings()
        texts = read_texts(file)
        added, existing = asyncio.run(_index_texts(settings, collection, texts))
        typer.echo(f"{collection}: {plural(added, 'text')} added, {existing} already there")

    @app.command("stats")
    @_friendly_errors
    def stats(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
        """Per collection: SQL items and engine vectors (equal when consistent), deletions remembered,
        model and index."""
        from indexer.engines import open_catalog

        catalog = open_catalog(_settings())
        try:
            rows = [
                {
                    "name": i.name,
                    "kind": i.kind,
                    "items": i.items,
                    "vectors": i.vectors,
                    "deleted": catalog.remembered_count(i.name),
                    "model": i.model,
                    "index": i.index,
                }
                for i in catalog.list_collections()
            ]
        finally:
            catalog.close()
        if as_json:
            typer.echo(json.dumps({"collections": rows}, ensure_ascii=False))
            return
        if not rows:
            typer.echo("no collections yet: `cnclip index FOLDER --collection NAME`")
            return
        from retrieval.columns import plain_columns

        columns = ("name", "kind", "items", "vectors", "deleted", "model", "index")
        for line in plain_columns(columns, [[row[key] for key in columns] for row in rows]):
            typer.echo(line)

    @app.command("reindex")
    @_friendly_errors
    def reindex(
        collection: Annotated[str, typer.Option("--collection", "-c", help="Collection whose vectors to rebuild.")],
    ) -> None:
        """Rebuild a collection's vector store (FAISS file or Milvus collection) from the vectors in SQL."""
        from indexer.names import check_collection_name

        check_collection_name(collection)
        count = _reindex(_settings(), collection)
        typer.echo(f"{collection}: vector store rebuilt from SQL, {count} vectors")

    @app.command("duplicates")
    @_friendly_errors
    def duplicates(
        collection: Annotated[str, typer.Option("--collection", "-c", help="Image collection to look in.")],
        tier: Annotated[
            DuplicateTier, typer.Option(help="identical (same bytes), resized (same picture), similar (shots), or all.")
        ] = DuplicateTier.all,
        limit: Annotated[int, typer.Option(min=1, max=MAX_LIMIT, help="Groups per page.")] = 20,
        offset: Annotated[int, typer.Option(min=0, max=MAX_OFFSET, help="Groups to skip.")] = 0,
        threshold: Annotated[
            float | None,
            typer.Option(min=MIN_THRESHOLD, max=1.0, help="Cosine where similar shots start (default: the model's)."),
        ] = None,
        hash_missing: Annotated[
            bool,
            typer.Option(
                "--hash-missing", help="First hash images indexed before perceptual hashes existed (uploads too)."
            ),
        ] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    ) -> None:
        """Near-duplicate groups of an image collection in three tiers (identical bytes, the same picture
        re-encoded or resized, similar shots), the suggested keeper first; nothing is deleted."""
        from indexer.duplicates_cli import find_duplicates, page_json, page_lines
        from indexer.names import check_collection_name

        check_collection_name(collection)
        page = find_duplicates(_settings(), collection, tier.value, limit, offset, threshold, hash_missing)  # type: ignore[arg-type]
        typer.echo(page_json(page) if as_json else "\n".join(page_lines(page)))

    @app.command("search")
    @_friendly_errors
    def search(
        text: Annotated[str, typer.Argument(help="What to look for, e.g. 穿红色裙子的女孩.")],
        collection: Annotated[
            str | None, typer.Option("--collection", "-c", help="Default: the oldest image collection.")
        ] = None,
        k: Annotated[int, typer.Option("-k", min=1, max=MAX_PAGE, help="How many results (one page).")] = 10,
        offset: Annotated[
            int, typer.Option(min=0, max=MAX_CANDIDATES - 1, help="Results to skip (the next page).")
        ] = 0,
        min_score: Annotated[
            float | None, typer.Option(min=-1.0, max=1.0, help="Leave out results scoring lower (relevance cutoff).")
        ] = None,
        sort: Annotated[
            Sort, typer.Option(help="relevance, taken (newest photo first) or added (newest indexed first).")
        ] = Sort.relevance,
        as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    ) -> None:
        """Search an image collection with a text query (a quick check from the shell); the same
        cutoff, orders and pages as the API's POST /v1/search/text."""
        from indexer.names import check_collection_name
        from indexer.paging import PageRequest
        from retrieval.errors import InvalidInput

        if collection is not None:
            check_collection_name(collection)
        if not text.strip():
            raise InvalidInput("the query is empty")
        page = PageRequest(k, offset, min_score, sort.order)
        page.check()  # before the model loads
        out = asyncio.run(_search(_settings(), text.strip(), collection, page))
        if as_json:
            typer.echo(json.dumps(out, ensure_ascii=False))
            return
        for rank, hit in enumerate(out["results"], start=offset + 1):
            taken = (hit["taken_at"] or "")[:10]
            typer.echo(
                f"{rank:3d}  {hit['score']:.4f}  #{hit['id']}  {taken:10}  {hit['path'] or hit['caption'] or ''}"
            )
        more = f"; next page: --offset {offset + len(out['results'])}" if out["has_more"] else ""
        hidden = f", {out['below_cutoff']} below --min-score" if min_score is not None else ""
        exact = "" if out["total_exact"] else " or more"
        typer.echo(f"{out['collection']}: {out['total']}{exact} results{hidden}{more}")


def _reindex(settings: StorageSettings, collection: str) -> int:
    from indexer.engines import open_catalog
    from indexer.progress import rebuild_progress

    catalog = open_catalog(settings, open_stores=False)
    try:
        catalog.get_collection(collection)  # a missing collection is one line, before any progress bar
        with rebuild_progress(collection) as progress:
            return catalog.rebuild(collection, on_progress=progress)
    finally:
        catalog.close()


async def _index(
    settings: StorageSettings,
    source: Path,
    collection: str,
    prune: bool,
    dry_run: bool,
    batch_size: int | None,
    index_factory: str | None,
    restore_deleted: bool = False,
) -> IndexSummary:
    from indexer.engines import open_catalog
    from indexer.pipeline import ImageIndexer
    from indexer.progress import IndexProgress
    from indexer.service import collection_service
    from retrieval.encoder import create_encoder
    from retrieval.errors import NotFound

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_sigint() -> None:
        # First Ctrl-C: finish the batches in flight and stop. A second one aborts at once.
        typer.echo("\nstopping after the batches in flight (Ctrl-C again to abort)…", err=True)
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    # A writer: vector stores are opened when it flushes, at the end (a server running meanwhile
    # catches up from SQL by itself).
    catalog = await asyncio.to_thread(open_catalog, settings, open_stores=False, sweep_media=True)
    encoder = create_encoder(settings)
    loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        service = collection_service(catalog, encoder, settings)
        # Kind and model are checked before the model loads (a dry run checks an existing collection).
        if not dry_run:
            await asyncio.to_thread(service.ensure, collection, "images", index_factory)
        else:
            with contextlib.suppress(NotFound):  # a missing collection: a real run would create it
                await asyncio.to_thread(service.writable, collection, "images")
        if not dry_run:  # a dry run decodes images without the model (indexer/pipeline.py)
            await encoder.start()
        indexer = ImageIndexer(
            service,
            encoder,
            collection,
            batch_size=batch_size or settings.index_batch_size,
            read_threads=settings.index_read_threads,
            inflight=max(2, settings.streams + 1),
            index_factory=index_factory,
            restore_deleted=restore_deleted,
        )
        with IndexProgress(collection) as progress:
            return await indexer.run(source, prune=prune, dry_run=dry_run, stop=stop, on_progress=progress.update)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        await encoder.close()
        await asyncio.to_thread(catalog.close)


async def _index_texts(settings: StorageSettings, collection: str, texts: list[Any]) -> tuple[int, int]:
    from indexer.engines import open_catalog
    from indexer.service import collection_service
    from indexer.texts import index_texts
    from retrieval.encoder import create_encoder

    catalog = await asyncio.to_thread(open_catalog, settings, open_stores=False)
    encoder = create_encoder(settings)
    try:
        service = collection_service(catalog, encoder, settings)
        await asyncio.to_thread(service.ensure, collection, "texts")
        await encoder.start()
        return await index_texts(service, encoder, collection, texts, batch_size=max(settings.buckets))
    finally:
        await encoder.close()
        await asyncio.to_thread(catalog.close)


async def _search(settings: StorageSettings, text: str, collection: str | None, page: PageRequest) -> dict[str, Any]:
    from indexer.engines import open_catalog
    from indexer.file_names import printable
    from indexer.service import collection_service
    from retrieval.encoder import create_encoder

    catalog = await asyncio.to_thread(open_catalog, settings, open_stores=False)
    encoder = create_encoder(settings)
    try:
        service = collection_service(catalog, encoder, settings)
        await asyncio.to_thread(service.resolve, collection, "images")  # before the model loads
        await encoder.start()
        vector = (await encoder.embed_texts([text]))[0]
        found = await asyncio.to_thread(service.search, collection, "images", vector, page)
        results = [
            {
                "id": f.item.id,
                "score": round(f.score, 6),
                "path": printable(f.item.path) if f.item.path is not None else None,
                "caption": f.item.caption,
                "taken_at": f.item.taken_at.isoformat() if f.item.taken_at else None,
                "taken_at_source": f.item.taken_source,
            }
            for f in found.results
        ]
        return {
            "collection": found.collection.name,
            "results": results,
            "total": found.total,
            "total_exact": found.total_exact,
            "has_more": found.has_more,
            "below_cutoff": found.below_cutoff,
        }
    finally:
        await encoder.close()
        await asyncio.to_thread(catalog.close)


def plural(count: int, noun: str) -> str:
    """`count` and `noun`, plural but for 1: "1 image", "0 images", "2 images"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def _write_report(path: Path, failures: list[tuple[str, str]]) -> None:
    from indexer.file_names import printable

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for where, why in failures:
            # A name with undecodable bytes is shown as `\\xNN`: the report is UTF-8 text.
            f.write(json.dumps({"path": printable(where), "reason": printable(why)}, ensure_ascii=False) + "\n")


def _print_summary(summary: IndexSummary, dry_run: bool) -> None:
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
        typer.echo(
            f"indexed {summary.added} new, {summary.changed} changed, {summary.renamed} renamed; "
            f"skipped {summary.skipped} (unchanged {summary.unchanged}, duplicates {summary.duplicates}, "
            f"not images {summary.not_images}, deleted earlier {summary.deleted_before}); failed {len(summary.failures)}; "
            f"pruned {summary.pruned}{dated}; {summary.seconds:.1f} s{rate}"
        )
    from indexer.file_names import printable

    for where, why in summary.failures[:SHOWN_FAILURES]:
        typer.echo(f"  bad: {printable(where)}: {printable(why)}")
    if len(summary.failures) > SHOWN_FAILURES:
        typer.echo(f"  … and {len(summary.failures) - SHOWN_FAILURES} more")
