"""Response bodies of near-duplicate groups (GET /v1/collections/{name}/duplicates): urls and file
names as search results show them, never server paths. The rules are indexer/duplicates.py's."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from api.searching import file_names, image_urls
from indexer.duplicates import DuplicateGroup, DuplicateMember, DuplicatesPage
from indexer.types import ItemRecord

TierName = Literal["identical", "resized", "similar"]
TIER_DOC = (
    "identical: the same bytes at several paths (an item and its copies); resized: the same picture "
    "re-encoded, resized or in another format (perceptual hash); similar: similar shots (CLIP cosine at or "
    "above the threshold). all: the three, in that order."
)


class DuplicateMemberOut(BaseModel):
    id: int = Field(
        description="The item (for a copy: the item whose bytes it has). Delete it with DELETE /v1/items/{id}."
    )
    copy_of_item: bool = Field(
        description="Another file with the item's bytes: not an item of its own (deleting the item forgets it too)."
    )
    keeper: bool = Field(description="The suggested one to keep: most pixels, then bytes, then metadata.")
    score: float = Field(description="Cosine similarity with the keeper (1 for the same bytes).")
    hamming: int | None = Field(description="Perceptual-hash bits apart from the keeper; None without hashes.")
    filename: str | None = Field(None, description="File name (None for uploads).")
    path: str | None = Field(None, description="Path relative to the folder that was indexed, when known.")
    caption: str | None
    mime: str | None
    size: int | None = Field(description="Bytes.")
    width: int | None
    height: int | None
    taken_at: datetime | None = Field(None, description="When the photo was taken (UTC).")
    taken_at_source: Literal["exif", "mtime", "upload"] | None = None
    image_url: str | None
    thumbnail_url: str | None


class DuplicateGroupOut(BaseModel):
    tier: TierName
    keeper: int = Field(description="The id of the suggested keeper (the first member).")
    members: list[DuplicateMemberOut]


class DuplicatesResponse(BaseModel):
    collection: str
    tier: Literal["all", "identical", "resized", "similar"]
    groups: list[DuplicateGroupOut]
    total: int = Field(description="Groups of the chosen tier(s) (found so far, when complete is false).")
    counts: dict[TierName, int] = Field(description="Groups per tier.")
    offset: int
    limit: int
    has_more: bool
    next_offset: int | None
    complete: bool = Field(
        description="False: the similar-shots search stopped at its time budget (CNCLIP_DUPLICATE_TIME_BUDGET_S); "
        "ask again to go on. Groups and pages may change until it is true."
    )
    examined: int = Field(description="Items whose similar shots were searched so far.")
    searchable: int = Field(description="Items the similar-shots search covers (a resized group counts once).")
    unhashed: int = Field(
        description="Images without a perceptual hash yet (indexed before it existed): `cnclip index` of their "
        "folder adds it. They can be in no resized group."
    )
    similar_threshold: float = Field(description="Cosine at which two photos count as similar shots.")
    similar_threshold_source: Literal["measured", "unmeasured", "setting", "request", "raised"] = Field(
        description="measured: on the demo gallery for this model; unmeasured: a default for models it was not "
        "measured on; setting: CNCLIP_DUPLICATE_THRESHOLD; raised: raised to keep the pairs within memory."
    )
    hamming_threshold: int = Field(description="Most perceptual-hash bits apart for the resized tier.")
    max_group_size: int = Field(description="Most members of a resized or similar group.")
    timings: dict[str, float] = Field(description="Milliseconds: total.")


def _member_out(member: DuplicateMember) -> DuplicateMemberOut:
    item: ItemRecord = member.item
    image_url, thumbnail_url = image_urls(item)
    filename, relative = file_names(ItemRecord(item.id, item.collection, item.kind, path=member.path, root=member.root))
    return DuplicateMemberOut(
        id=item.id,
        copy_of_item=member.copy,
        keeper=member.keeper,
        score=member.score,
        hamming=member.hamming,
        filename=filename,
        path=relative,
        caption=item.caption,
        mime=item.mime,
        size=member.size,
        width=item.width,
        height=item.height,
        taken_at=member.taken_at,
        taken_at_source=member.taken_source,
        image_url=image_url,
        thumbnail_url=thumbnail_url,
    )


def _group_out(group: DuplicateGroup) -> DuplicateGroupOut:
    return DuplicateGroupOut(
        tier=group.tier, keeper=group.members[0].item.id, members=[_member_out(m) for m in group.members]
    )


def duplicates_out(page: DuplicatesPage, timings: dict[str, float]) -> DuplicatesResponse:
    return DuplicatesResponse(
        collection=page.collection,
        tier=page.tier,
        groups=[_group_out(g) for g in page.groups],
        total=page.total,
        counts=dict(page.counts),
        offset=page.offset,
        limit=page.limit,
        has_more=page.has_more,
        next_offset=page.offset + page.limit if page.has_more else None,
        complete=page.complete,
        examined=page.examined,
        searchable=page.searchable,
        unhashed=page.unhashed,
        similar_threshold=page.threshold,
        similar_threshold_source=page.threshold_source,
        hamming_threshold=page.hamming_threshold,
        max_group_size=page.max_group_size,
        timings=timings,
    )
