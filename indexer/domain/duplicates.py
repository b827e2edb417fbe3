"""Near-duplicate records (docs/duplicates.md): the files that hold an item's bytes elsewhere, the
similar-shots calibration, and one page of groups as the service hands it out. The groups are found by
indexer/service/duplicates.py, the calibration measured by indexer/service/duplicate_calibration.py."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from indexer.domain.duplicate_pages import Tier, TierChoice
from indexer.domain.records import ItemRecord, TakenSource

CALIBRATION_VERSION = 1  # the calibration rule's version: one measured by an older rule is measured again
ThresholdSource = Literal["calibrated", "off", "measured", "unmeasured", "setting", "request", "raised"]


@dataclass(frozen=True)
class FileCopy:
    """A file whose bytes an item of the collection has (another path)."""

    sha256: str
    path: str
    root: str | None
    size: int | None
    mtime: float | None


@dataclass(frozen=True)
class Calibration:
    """One measurement (stored as JSON in `duplicate_calibrations.details`)."""

    model: str
    generation: int
    item_count: int
    sampled: int  # items measured
    same_shot_low: float | None  # POSITIVE_QUANTILE of edit scores
    different_photo_high: float | None  # NEGATIVE_QUANTILE of nearest-other scores
    threshold: float | None  # None: not calibrated (off on "overlap", the model's default on "too_few")
    resized_gate: float | None  # the cosine a resized pair must reach (None: the threshold)
    reason: str  # why this threshold, or why the tier is off
    reason_code: str  # calibrated | overlap | too_few
    computed_at: str
    version: int = CALIBRATION_VERSION

    @property
    def enabled(self) -> bool:
        """False: the model cannot separate shots from photos here (the similar tier is off)."""
        return self.reason_code != "overlap"


@dataclass(frozen=True)
class KeeperReason:
    code: (
        str  # more_detail | not_upscaled | lossless | higher_quality | more_metadata | more_bytes | oldest | same_bytes
    )
    text: str


SAME_BYTES = KeeperReason("same_bytes", "the same bytes at every path: the item itself is kept")


@dataclass(frozen=True)
class DuplicateMember:
    """One picture of a group: an item, or (tier `identical`) another file with its bytes."""

    item: ItemRecord
    path: str | None  # this member's file: the item's, or the copy's
    root: str | None  # the folder `path` was indexed from
    size: int | None
    taken_at: datetime | None
    taken_source: TakenSource | None
    keeper: bool
    score: float  # cosine of its vector with the keeper's (1.0 for the same bytes)
    hamming: int | None  # perceptual-hash bits apart from the keeper's (None when either has no hash)
    copy: bool = False  # another file with the item's bytes: not an item of its own


@dataclass(frozen=True)
class DuplicateGroup:
    tier: Tier
    members: list[DuplicateMember]  # the suggested keeper first
    keeper_reason: KeeperReason = SAME_BYTES  # why the first member is suggested (indexer/service/keeper.py)


@dataclass(frozen=True)
class DuplicatesPage:
    collection: str
    tier: TierChoice
    groups: list[DuplicateGroup]
    offset: int
    limit: int
    total: int  # groups of the chosen tier(s), so far when not complete
    counts: dict[Tier, int]
    complete: bool  # False: the similar-shots search stopped at its time budget; ask again to go on
    examined: int  # items whose similar shots were searched
    searchable: int  # items the similar-shots search covers (a resized group counts once)
    unhashed: int  # images without a perceptual hash yet (`cnclip index` of their folder adds it)
    threshold: float | None  # cosine where similar shots start (raised when the pairs would outgrow memory);
    # None: the similar tier is off (the calibration found the model cannot separate shots from photos here)
    threshold_source: ThresholdSource
    hamming_threshold: int
    max_group_size: int
    calibration: Calibration | None = None  # the stored measurement (indexer/service/duplicate_calibration.py)
    similar_note: str | None = None  # why the similar tier is off, or why its threshold is not calibrated
    resized_gate: float | None = None  # the cosine a resized pair must reach

    @property
    def has_more(self) -> bool:
        return self.offset + self.limit < self.total
