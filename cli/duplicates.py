"""`cnclip duplicates`: the near-duplicate groups of a collection on the terminal (or as JSON), the same
answer as GET /v1/collections/{name}/duplicates, searched to the end (with a progress bar) instead of
within a request's time budget. No model is loaded: the groups come from stored vectors and hashes."""

from __future__ import annotations

import asyncio
import json
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.errors import friendly_errors
from indexer.duplicate_pages import MAX_LIMIT, MAX_OFFSET, MIN_THRESHOLD, TIERS, TierChoice
from indexer.file_names import printable

if TYPE_CHECKING:
    from indexer.duplicates import DuplicateMember, DuplicatesPage
    from indexer.service import CollectionService

STEP_S = 1.0  # the search runs in steps this long between progress updates
TIER_TITLES = {
    "identical": "identical bytes",
    "resized": "the same picture, re-encoded or resized",
    "similar": "similar shots",
}


class DuplicateTier(StrEnum):
    """`cnclip duplicates --tier` (indexer/duplicate_pages.py TIER_CHOICES)."""

    all = "all"
    identical = "identical"
    resized = "resized"
    similar = "similar"


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
    from cli.catalog import storage_settings
    from indexer.names import check_collection_name

    check_collection_name(collection)
    request = (collection, tier.value, limit, offset, threshold)
    page = asyncio.run(_find(storage_settings(), request, hash_missing))
    typer.echo(page_json(page) if as_json else "\n".join(page_lines(page)))


async def _find(settings: Any, request: tuple[str, Any, int, int, float | None], hash_missing: bool) -> DuplicatesPage:
    from indexer.runtime import open_runtime

    async with open_runtime(settings, encoder=False) as rt:  # stored vectors only: no vector store, no model
        assert rt.service is not None
        return await asyncio.to_thread(_search_to_the_end, rt.service, request, hash_missing)


def _search_to_the_end(
    service: CollectionService, request: tuple[str, TierChoice, int, int, float | None], hash_missing: bool
) -> DuplicatesPage:
    """One page of the collection's groups, the similar-shots search run to its end (after hashing the
    images without a perceptual hash, with `hash_missing`)."""
    from cli.progress import rebuild_progress

    collection, tier, limit, offset, threshold = request
    name = service.get(collection).name  # a missing collection is one line, before any bar
    if hash_missing:
        with rebuild_progress(f"{name}: perceptual hashes") as progress:
            hashed = service.hash_missing(collection, progress)
        typer.echo(f"{name}: {hashed} images hashed", err=True)
    page = service.duplicates(collection, tier, offset, limit, budget_s=STEP_S, threshold=threshold)
    if not page.complete:
        with rebuild_progress(f"{name}: similar shots") as progress:
            while not page.complete:
                progress(page.examined, page.searchable)
                page = service.duplicates(collection, tier, offset, limit, budget_s=STEP_S, threshold=threshold)
    return page


def _member_line(member: DuplicateMember) -> str:
    item = member.item
    mark = "keep" if member.keeper else ("copy" if member.copy else "    ")
    size = f"{(member.size or 0) / 1e6:.1f} MB" if member.size else "-"
    pixels = f"{item.width}×{item.height}" if item.width and item.height else "-"
    taken = member.taken_at.date().isoformat() if member.taken_at else "-"
    bits = f"{member.hamming:2d}b" if member.hamming is not None else " -b"
    where = printable(member.path) if member.path else (item.caption or "(upload)")
    return f"  {mark}  #{item.id:<6d} {member.score:.3f} {bits}  {pixels:>11}  {size:>8}  {taken:10}  {where}"


def page_lines(page: DuplicatesPage) -> list[str]:
    """The page for people: one block per group (the keeper first), then the counts."""
    lines: list[str] = []
    for number, group in enumerate(page.groups, start=page.offset + 1):
        lines.append(f"{number}. {TIER_TITLES[group.tier]} ({len(group.members)})")
        lines.extend(_member_line(m) for m in group.members)
    counts = ", ".join(f"{page.counts[t]} {TIER_TITLES[t]}" for t in TIERS)
    more = f"; next page: --offset {page.offset + page.limit}" if page.has_more else ""
    lines.append(f"{page.collection}: {counts}{more}")
    source = {"measured": "measured for this model", "unmeasured": "NOT measured for this model"}.get(
        page.threshold_source, page.threshold_source
    )
    lines.append(f"similar shots from cosine {page.threshold} ({source}); resized within {page.hamming_threshold} bits")
    if page.unhashed:
        lines.append(
            f"{page.unhashed} images have no perceptual hash yet: `cnclip index` their folders, or --hash-missing"
        )
    return lines


def page_json(page: DuplicatesPage) -> str:
    """The page for programs: the API's fields (paths as indexed: this runs on the catalog's machine)."""
    groups = [
        {
            "tier": g.tier,
            "keeper": g.members[0].item.id,
            "members": [
                {
                    "id": m.item.id,
                    "copy_of_item": m.copy,
                    "keeper": m.keeper,
                    "score": m.score,
                    "hamming": m.hamming,
                    "path": printable(m.path) if m.path else None,
                    "caption": m.item.caption,
                    "size": m.size,
                    "width": m.item.width,
                    "height": m.item.height,
                    "taken_at": m.taken_at.isoformat() if m.taken_at else None,
                    "taken_at_source": m.taken_source,
                }
                for m in g.members
            ],
        }
        for g in page.groups
    ]
    return json.dumps(
        {
            "collection": page.collection,
            "tier": page.tier,
            "groups": groups,
            "total": page.total,
            "counts": page.counts,
            "offset": page.offset,
            "limit": page.limit,
            "has_more": page.has_more,
            "complete": page.complete,
            "unhashed": page.unhashed,
            "similar_threshold": page.threshold,
            "similar_threshold_source": page.threshold_source,
            "hamming_threshold": page.hamming_threshold,
        },
        ensure_ascii=False,
    )


def register(app: typer.Typer) -> None:
    """`cnclip duplicates`."""
    app.command("duplicates")(friendly_errors(duplicates))
