"""The catalog's part of near-duplicate groups (indexer/service/duplicates.py): perceptual hashes, the copies
`cnclip index` meets, and the finder that groups them — SQL work behind the `Catalog` protocol, so
that the collection service stays the only caller."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
from sqlalchemy import Engine

from indexer.domain.duplicate_pages import TierChoice
from indexer.service import duplicate_calibration as calibration
from indexer.service.duplicate_calibration import Calibration
from indexer.service.duplicates import DuplicateFinder, DuplicatesPage
from indexer.storage.sql import duplicate_rows

if TYPE_CHECKING:
    from indexer.domain.records import CollectionState, ItemRecord
    from indexer.storage.sql.rows import ItemRows


class _Catalog(Protocol):
    engine: Engine
    rows: ItemRows

    def get_many(self, ids: Sequence[int]) -> list[ItemRecord]: ...

    @property
    def duplicate_finder(self) -> DuplicateFinder: ...

    def collection(self, name: str) -> CollectionState: ...


class CatalogDuplicates:
    """Mixed into `SqlCatalog`: every method takes a collection name the caller has checked."""

    _finder: DuplicateFinder | None = None

    @property
    def duplicate_finder(self) -> DuplicateFinder:
        """The catalog's one finder (its cache and its lock: one search at a time), made on first use."""
        if self._finder is None:
            self._finder = DuplicateFinder(self)  # type: ignore[arg-type]  # only SqlCatalog mixes this in
        return self._finder

    def find_duplicates(
        self: _Catalog,
        name: str,
        tier: TierChoice,
        offset: int,
        limit: int,
        *,
        budget_s: float | None,
        threshold: float | None,
        setting_threshold: float | None,
    ) -> DuplicatesPage:
        return self.duplicate_finder.find(
            self.collection(name),
            tier,
            offset,
            limit,
            budget_s=budget_s,
            threshold=threshold,
            setting_threshold=setting_threshold,
        )

    def unhashed_ids(self: _Catalog, name: str) -> list[int]:
        return duplicate_rows.unhashed_ids(self.engine, self.collection(name).id)

    def set_phashes(self: _Catalog, name: str, updates: Sequence[tuple[int, int]]) -> None:
        duplicate_rows.set_phashes(self.engine, self.collection(name).id, updates)

    def record_copies(self: _Catalog, name: str, copies: Sequence[duplicate_rows.FileCopy]) -> None:
        duplicate_rows.record_copies(self.engine, self.collection(name).id, copies)

    def prune_copies(self: _Catalog, name: str) -> int:
        return duplicate_rows.prune_copies(self.engine, self.collection(name).id)

    # --- the similar-shots calibration (indexer/service/duplicate_calibration.py) ------------------------------
    def duplicate_calibration(self: _Catalog, name: str) -> tuple[Calibration | None, str | None]:
        """(the stored calibration, why it must be measured again or None when it holds)."""
        state = self.collection(name)
        stored = calibration.load(self.engine, state.id)
        return stored, calibration.stale_reason(stored, state, calibration.count_items(self.engine, state.id))

    def calibration_sample(self: _Catalog, name: str) -> list[ItemRecord]:
        """The items a calibration measures (a fixed-seed sample), as records."""
        state = self.collection(name)
        ids = calibration.sample_ids(self.rows.ids(state.id))
        return self.get_many([int(i) for i in ids])

    def finish_calibration(self: _Catalog, name: str, measured: Sequence[tuple[int, np.ndarray]]) -> Calibration:
        """Score (item id, vectors of its edits) against the stored vectors, find each sampled item's
        nearest other item, decide, and store the calibration with the collection."""
        state = self.collection(name)
        all_ids = self.rows.ids(state.id)
        ids = np.array([item_id for item_id, _ in measured if item_id in set(all_ids.tolist())], dtype=np.int64)
        edits = {item_id: vectors for item_id, vectors in measured}
        stored = self.rows.vectors(ids) if len(ids) else np.empty((0, state.dim), np.float32)
        positives = (
            np.concatenate([edits[int(i)] @ stored[row] for row, i in enumerate(ids)]) if len(ids) else np.empty(0)
        )
        hashed, hashes = duplicate_rows.hashed_items(self.engine, state.id)
        by_id = dict(zip(hashed.tolist(), hashes.tolist(), strict=True))
        taken = calibration.exif_times(self.engine, state.id)
        negatives = calibration.nearest_other(ids, stored, all_ids, self.rows.vectors, by_id, taken)
        result = calibration.decide(state, len(all_ids), positives, negatives, len(ids))
        calibration.save(self.engine, state.id, result)
        return result
