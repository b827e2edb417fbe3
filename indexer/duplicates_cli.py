"""`cnclip duplicates`: the near-duplicate groups of a collection on the terminal (or as JSON), the same
answer as GET /v1/collections/{name}/duplicates, searched to the end (with a progress bar) instead of
within a request's time budget. Plain functions: the typer command only parses options."""

from __future__ import annotations

import json
from typing import Any

import typer

from indexer.duplicate_pages import TIERS, TierChoice
from indexer.duplicates import DuplicateMember, DuplicatesPage
from indexer.file_names import printable

STEP_S = 1.0  # the search runs in steps this long between progress updates
TIER_TITLES = {
    "identical": "identical bytes",
    "resized": "the same picture, re-encoded or resized",
    "similar": "similar shots",
}


def find_duplicates(
    settings: Any,
    collection: str,
    tier: TierChoice,
    limit: int,
    offset: int,
    threshold: float | None,
    hash_missing: bool = False,
) -> DuplicatesPage:
    """One page of the collection's groups, the similar-shots search run to its end (after hashing the
    images without a perceptual hash, with `hash_missing`)."""
    from indexer.engines import open_catalog
    from indexer.progress import rebuild_progress
    from indexer.service import CollectionService, ModelIdentity

    catalog = open_catalog(settings, open_stores=False)  # stored vectors only: no vector store, no model
    try:
        info = catalog.get_collection(collection)
        service = CollectionService(
            catalog, ModelIdentity(info.model, info.dim), duplicate_threshold=settings.duplicate_threshold
        )
        if hash_missing:
            with rebuild_progress(f"{info.name}: perceptual hashes") as progress:
                hashed = service.hash_missing(collection, progress)
            typer.echo(f"{info.name}: {hashed} images hashed", err=True)
        page = service.duplicates(collection, tier, offset, limit, budget_s=STEP_S, threshold=threshold)
        if not page.complete:
            with rebuild_progress(f"{info.name}: similar shots") as progress:
                while not page.complete:
                    progress(page.examined, page.searchable)
                    page = service.duplicates(collection, tier, offset, limit, budget_s=STEP_S, threshold=threshold)
        return page
    finally:
        catalog.close()


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
