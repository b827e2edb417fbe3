"""`cnclip duplicates`: the near-duplicate groups of a collection on the terminal (or as JSON), the same
answer as GET /v1/collections/{name}/duplicates, searched to the end (with a progress bar) instead of
within a request's time budget. The groups come from stored vectors and hashes; the model is loaded
only to measure where similar shots start when the collection has no up-to-date calibration
(indexer/service/duplicate_calibration.py; not with --threshold or CNCLIP_DUPLICATE_THRESHOLD)."""

from __future__ import annotations

import asyncio
import json
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.errors import friendly_errors
from indexer.domain.duplicate_pages import MAX_LIMIT, MAX_OFFSET, MIN_THRESHOLD, TIERS, TierChoice
from indexer.fs.file_names import printable

if TYPE_CHECKING:
    from indexer.config import StorageSettings
    from indexer.domain.duplicates import DuplicateMember, DuplicatesPage
    from indexer.service.collections import CollectionService

STEP_S = 1.0  # the search runs in steps this long between progress updates
TIER_TITLES = {
    "identical": "identical bytes",
    "resized": "the same picture, re-encoded or resized",
    "similar": "similar shots",
}


class DuplicateTier(StrEnum):
    """`cnclip duplicates --tier` (indexer/domain/duplicate_pages.py TIER_CHOICES)."""

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
            "--hash-missing",
            help="First hash images without a perceptual hash, or with one of an earlier hash version (uploads too).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Near-duplicate groups of an image collection in three tiers (identical bytes, the same picture
    re-encoded or resized, similar shots), the suggested keeper first; nothing is deleted."""
    from cli.catalog import storage_settings
    from indexer.domain.names import check_collection_name

    check_collection_name(collection)
    request = (collection, tier.value, limit, offset, threshold)
    page = asyncio.run(_find(storage_settings(), request, hash_missing))
    typer.echo(page_json(page) if as_json else "\n".join(page_lines(page)))


async def _find(
    settings: StorageSettings, request: tuple[str, Any, int, int, float | None], hash_missing: bool
) -> DuplicatesPage:
    from indexer.runtime import open_runtime

    if request[4] is None:
        await _calibrate(settings, request[0])
    async with open_runtime(settings, encoder=False) as rt:  # stored vectors only: no vector store, no model
        assert rt.service is not None
        return await asyncio.to_thread(_search_to_the_end, rt.service, request, hash_missing)


async def _calibrate(settings: StorageSettings, collection: str) -> None:
    """Measure the similar-shots threshold with the collection's model when the stored one is missing
    or stale (the model is loaded only then); a model that cannot be loaded here leaves the answer
    to say the threshold is not calibrated."""
    from indexer.runtime import open_runtime

    async with open_runtime(settings, encoder=False) as rt:
        assert rt.service is not None
        name = rt.service.get(collection).name  # a missing collection is one line, before the model loads
        _, stale = await asyncio.to_thread(rt.service.duplicates.calibration, name)
    if stale is None or getattr(settings, "duplicate_threshold", None) is not None:
        return
    typer.echo(f"{name}: measuring where similar shots start with the collection's model ({stale})", err=True)
    try:
        async with open_runtime(settings) as rt:
            assert rt.service is not None
            await rt.service.duplicates.calibrate(name)
            if (await asyncio.to_thread(rt.service.duplicates.calibration, name))[1] is not None:
                typer.echo(f"{name}: not measured: the configured model is not the collection's", err=True)
    except Exception as exc:  # noqa: BLE001 — optional: the answer then says it is not calibrated
        typer.echo(f"{name}: similar shots not calibrated: {exc}", err=True)


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
            hashed = service.duplicates.hash_missing(collection, progress)
        typer.echo(f"{name}: {hashed} images hashed", err=True)
    page = service.duplicates.page(collection, tier, offset, limit, budget_s=STEP_S, threshold=threshold)
    if not page.complete:
        with rebuild_progress(f"{name}: similar shots") as progress:
            while not page.complete:
                progress(page.examined, page.searchable)
                page = service.duplicates.page(collection, tier, offset, limit, budget_s=STEP_S, threshold=threshold)
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
        lines.append(f"{number}. {TIER_TITLES[group.tier]} ({len(group.members)}); keep: {group.keeper_reason.text}")
        lines.extend(_member_line(m) for m in group.members)
    counts = ", ".join(f"{page.counts[t]} {TIER_TITLES[t]}" for t in TIERS)
    more = f"; next page: --offset {page.offset + page.limit}" if page.has_more else ""
    lines.append(f"{page.collection}: {counts}{more}")
    source = {
        "measured": "measured for this model on the demo gallery",
        "unmeasured": "NOT measured for this model",
        "calibrated": "calibrated on this collection",
    }.get(page.threshold_source, page.threshold_source)
    if page.threshold is None:
        lines.append(f"similar shots: OFF ({page.similar_note})")
    else:
        lines.append(f"similar shots from cosine {page.threshold} ({source})")
        if page.similar_note:
            lines.append(f"  {page.similar_note}")
    lines.append(f"resized: within {page.hamming_threshold} bits and cosine {page.resized_gate}")
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
            "keeper_reason": {"code": g.keeper_reason.code, "text": g.keeper_reason.text},
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
            "similar_note": page.similar_note,
            "resized_threshold": page.resized_gate,
            "calibration": calibration_json(page),
            "hamming_threshold": page.hamming_threshold,
        },
        ensure_ascii=False,
    )


def calibration_json(page: DuplicatesPage) -> dict[str, Any] | None:
    """The stored calibration as `--json` and the API show it."""
    from indexer.service.duplicate_calibration import summary

    return summary(page.calibration)


def register(app: typer.Typer) -> None:
    """`cnclip duplicates`."""
    app.command("duplicates")(friendly_errors(duplicates))
