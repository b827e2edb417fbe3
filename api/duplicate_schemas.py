"""Response bodies of near-duplicate groups (GET /v1/collections/{name}/duplicates): urls and file
names as search results show them, never server paths. The rules are indexer/service/duplicates.py's."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from api.searching import file_names, image_urls
from indexer.domain.duplicates import DuplicateGroup, DuplicateMember, DuplicatesPage
from indexer.domain.records import ItemRecord

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
    keeper: bool = Field(
        description="The suggested one to keep: the original (most real detail, not upscaled, lossless, higher "
        "JPEG quality, richer metadata); the group's keeper_reason says which decided."
    )
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


class KeeperReasonOut(BaseModel):
    code: Literal[
        "more_detail",
        "not_upscaled",
        "lossless",
        "higher_quality",
        "more_metadata",
        "more_bytes",
        "oldest",
        "same_bytes",
    ] = Field(description="What told the keeper apart from the runner-up (indexer/service/keeper.py).")
    text: str = Field(description="The same for people, with the measured values.")


class CalibrationOut(BaseModel):
    model: str = Field(description="The model id the calibration was measured with.")
    generation: int
    item_count: int = Field(description="Items in the collection when measured (measured again at 1.5× or 1/1.5).")
    sampled: int = Field(description="Photos measured (edited copies embedded with the model).")
    same_shot_low: float | None = Field(description="5th percentile of edited copies' cosine with their photo.")
    different_photo_high: float | None = Field(
        description="95th percentile of photos' cosine with their nearest other photo (not the same picture)."
    )
    threshold: float | None = Field(description="The similar-shots threshold chosen; null: the tier is off.")
    resized_gate: float | None = Field(description="The cosine a resized pair must reach when the tier is off.")
    reason: str
    reason_code: Literal["calibrated", "overlap", "too_few"]
    computed_at: str
    version: int


class DuplicateGroupOut(BaseModel):
    tier: TierName
    keeper: int = Field(description="The id of the suggested keeper (the first member).")
    keeper_reason: KeeperReasonOut = Field(description="Why that member is suggested.")
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
    similar_threshold: float | None = Field(
        description="Cosine at which two photos count as similar shots; null: the similar tier is off (similar_note "
        "says why)."
    )
    similar_threshold_source: Literal["calibrated", "off", "measured", "unmeasured", "setting", "request", "raised"] = (
        Field(
            description="calibrated: measured on this collection with its model (calibration); off: the calibration "
            "found the model cannot separate shots from other photos here, or too few photos; measured: the demo "
            "gallery's value for this model (not calibrated on this collection yet); unmeasured: a default for other "
            "models; setting: CNCLIP_DUPLICATE_THRESHOLD; raised: raised to keep the pairs within memory."
        )
    )
    similar_note: str | None = Field(
        None, description="Why the similar tier is off, how the threshold was chosen, or why it is not calibrated."
    )
    resized_threshold: float | None = Field(None, description="The cosine a resized pair must reach too.")
    calibration: CalibrationOut | None = Field(
        None, description="The similar-shots calibration stored with the collection (docs/duplicates.md)."
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
        tier=group.tier,
        keeper=group.members[0].item.id,
        keeper_reason=KeeperReasonOut(code=group.keeper_reason.code, text=group.keeper_reason.text),  # type: ignore[arg-type]
        members=[_member_out(m) for m in group.members],
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
        similar_note=page.similar_note,
        resized_threshold=page.resized_gate,
        calibration=None if page.calibration is None else CalibrationOut(**asdict(page.calibration)),
        hamming_threshold=page.hamming_threshold,
        max_group_size=page.max_group_size,
        timings=timings,
    )
