"""`cnclip db upgrade`, `stats`, `reindex` and `search`: the catalog from the shell, through the
runtime (indexer/runtime.py) and the collection service."""

from __future__ import annotations

import asyncio
import json
import unicodedata
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.errors import friendly_errors
from indexer.domain.paging import MAX_CANDIDATES, MAX_PAGE, SortOrder

if TYPE_CHECKING:
    from indexer.config import StorageSettings
    from indexer.domain.paging import PageRequest
    from indexer.domain.results import CollectionStats
    from indexer.domain.text_query import SearchMode

STATS_COLUMNS = ("name", "kind", "items", "vectors", "deleted", "model", "index")


class Sort(StrEnum):
    """`cnclip search --sort` (indexer/domain/paging.py SortOrder): a choice, so a typo is a usage error (2)."""

    relevance = "relevance"
    taken = "taken"
    added = "added"

    @property
    def order(self) -> SortOrder:
        return self.value  # type: ignore[return-value]


class Mode(StrEnum):
    """`cnclip search --mode` (indexer/domain/text_query.py SearchMode)."""

    clip = "clip"
    text = "text"
    hybrid = "hybrid"


def shown(text: str) -> str:
    """Recognised text for a terminal: control characters (an image can say anything, escape sequences
    included) become "?", line breaks " / "."""
    return "".join(" / " if ch == "\n" else "?" if unicodedata.category(ch) in ("Cc", "Cf") else ch for ch in text)


def matched_line(match: dict[str, Any]) -> str:
    """The recognised line holding the match, the matched characters in 【】."""
    line, begin = match["line"], match["start"] - match["line_start"]
    end = min(len(line), match["end"] - match["line_start"])
    return f"{shown(line[:begin])}【{shown(line[begin:end])}】{shown(line[end:])}"


def storage_settings() -> StorageSettings:
    from cli.errors import read_settings
    from indexer.config import StorageSettings

    return read_settings(StorageSettings)


def register_db(app: typer.Typer) -> None:
    """`cnclip db upgrade`."""
    db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
    app.add_typer(db_app, name="db")

    @db_app.command("upgrade")
    @friendly_errors
    def db_upgrade() -> None:
        """Create or migrate the catalog database (SQLite file or CNCLIP_DATABASE_URL) to the newest schema."""
        from indexer.runtime import upgrade_database

        revision = upgrade_database(storage_settings())
        typer.echo(f"database at schema revision {revision}")


def register(app: typer.Typer) -> None:
    """`cnclip stats`, `reindex` and `search`."""
    app.command("stats")(friendly_errors(stats))
    app.command("reindex")(friendly_errors(reindex))
    app.command("search")(friendly_errors(search))


def stats(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """Per collection: SQL items and engine vectors (equal when consistent), deletions remembered,
    model and index. Answered from SQL when the engine cannot be asked (a Milvus Lite file another
    process holds): vectors then read null ("-"), with the reason."""
    lines = asyncio.run(_stats(storage_settings()))
    rows = [_stats_row(line) for line in lines]
    if as_json:
        typer.echo(json.dumps({"collections": rows}, ensure_ascii=False))
        return
    if not rows:
        typer.echo("no collections yet: `cnclip index FOLDER --collection NAME`")
        return
    from cli.output import plain_columns

    cells = [["-" if row[key] is None else row[key] for key in STATS_COLUMNS] for row in rows]
    for line in plain_columns(STATS_COLUMNS, cells):
        typer.echo(line)
    for reason in dict.fromkeys(row["vectors_unavailable"] for row in rows if "vectors_unavailable" in row):
        typer.echo(f"vectors not counted: {reason}")


async def _stats(settings: StorageSettings) -> list[CollectionStats]:
    from indexer.runtime import open_runtime

    async with open_runtime(settings, encoder=False) as rt:
        assert rt.service is not None
        return await asyncio.to_thread(rt.service.stats)


def _stats_row(line: CollectionStats) -> dict[str, Any]:
    info = line.info
    row: dict[str, Any] = {"name": info.name, "kind": info.kind, "items": info.items, "vectors": line.vectors}
    row.update(deleted=line.deleted, model=info.model, index=info.index)
    if line.vectors_unavailable is not None:
        row["vectors_unavailable"] = line.vectors_unavailable
    return row


def reindex(
    collection: Annotated[str, typer.Option("--collection", "-c", help="Collection whose vectors to rebuild.")],
) -> None:
    """Rebuild a collection's vector store (FAISS file or Milvus collection) from the vectors in SQL."""
    from indexer.domain.names import check_collection_name

    check_collection_name(collection)
    count = asyncio.run(_reindex(storage_settings(), collection))
    typer.echo(f"{collection}: vector store rebuilt from SQL, {count} vectors")


async def _reindex(settings: StorageSettings, collection: str) -> int:
    from cli.progress import rebuild_progress
    from indexer.runtime import open_runtime

    async with open_runtime(settings, encoder=False) as rt:
        assert rt.service is not None
        await asyncio.to_thread(rt.service.get, collection)  # a missing collection is one line, before any bar
        with rebuild_progress(collection) as progress:
            return await asyncio.to_thread(rt.service.rebuild, collection, progress)


def search(
    text: Annotated[str, typer.Argument(help="What to look for, e.g. 穿红色裙子的女孩.")],
    collection: Annotated[
        str | None, typer.Option("--collection", "-c", help="Default: the oldest image collection.")
    ] = None,
    k: Annotated[int, typer.Option("-k", min=1, max=MAX_PAGE, help="How many results (one page).")] = 10,
    offset: Annotated[int, typer.Option(min=0, max=MAX_CANDIDATES - 1, help="Results to skip (the next page).")] = 0,
    min_score: Annotated[
        float | None, typer.Option(min=-1.0, max=1.0, help="Leave out results scoring lower (relevance cutoff).")
    ] = None,
    sort: Annotated[
        Sort, typer.Option(help="relevance, taken (newest photo first) or added (newest indexed first).")
    ] = Sort.relevance,
    exclude: Annotated[
        list[str] | None,
        typer.Option(
            "--exclude", "-x", help="Push away results matching this text (repeatable: -x 人 -x 车; at most 8)."
        ),
    ] = None,
    mode: Annotated[
        Mode | None,
        typer.Option(
            help="clip, text (the text recognised in photos) or hybrid (both); default: hybrid where the "
            'collection has --ocr, else clip. In text and hybrid a quoted part ("会议室") must be in the photo.'
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Search an image collection with a text query (a quick check from the shell); the same
    cutoff, orders, pages and exclusions as the API's POST /v1/search/text."""
    from indexer.domain.exclusion import excluded_texts
    from indexer.domain.names import check_collection_name
    from indexer.domain.paging import PageRequest
    from retrieval.errors import InvalidInput

    if collection is not None:
        check_collection_name(collection)
    if not text.strip():
        raise InvalidInput("the query is empty")
    page = PageRequest(k, offset, min_score, sort.order)
    page.check()  # before the model loads
    excluded = excluded_texts(exclude)  # likewise
    chosen: SearchMode | None = mode.value if mode is not None else None  # type: ignore[assignment]
    out = asyncio.run(_search(storage_settings(), text.strip(), collection, page, excluded, chosen))
    if as_json:
        typer.echo(json.dumps(out, ensure_ascii=False))
        return
    for rank, hit in enumerate(out["results"], start=offset + 1):
        taken = (hit["taken_at"] or "")[:10]
        typer.echo(f"{rank:3d}  {hit['score']:.4f}  #{hit['id']}  {taken:10}  {hit['path'] or hit['caption'] or ''}")
        if hit["matched_text"] is not None:
            typer.echo(f"{'':5}text: {matched_line(hit['matched_text'])}")
    more = f"; next page: --offset {offset + len(out['results'])}" if out["has_more"] else ""
    hidden = f", {out['below_cutoff']} below --min-score" if min_score is not None else ""
    exact = "" if out["total_exact"] else " or more"
    typer.echo(f"{out['collection']}: {out['total']}{exact} results{hidden}{more}")


async def _search(
    settings: StorageSettings,
    text: str,
    collection: str | None,
    page: PageRequest,
    excluded: tuple[str, ...] = (),
    mode: SearchMode | None = None,
) -> dict[str, Any]:
    from dataclasses import asdict

    from indexer.fs.file_names import printable
    from indexer.runtime import open_runtime

    async with open_runtime(settings, warm=False) as rt:
        assert rt.service is not None
        await asyncio.to_thread(rt.service.resolver.resolve, collection, "images")  # before the model loads
        await rt.start_encoders()
        found = await rt.service.search.text(text, collection, page, excluded=excluded, mode=mode)
    results = [
        {
            "id": f.item.id,
            "score": round(f.score, 6),
            "path": printable(f.item.path) if f.item.path is not None else None,
            "caption": f.item.caption,
            "taken_at": f.item.taken_at.isoformat() if f.item.taken_at else None,
            "taken_at_source": f.item.taken_source,
            "matched_text": asdict(f.match) if f.match is not None else None,
        }
        for f in found.results
    ]
    totals = {"total": found.total, "total_exact": found.total_exact, "has_more": found.has_more}
    return {
        "collection": found.collection.name,
        "results": results,
        **totals,
        "below_cutoff": found.below_cutoff,
        "exclude": list(excluded),
        "mode": found.mode,
    }
