"""The catalog's store of near-duplicate data (the `DuplicateStore` port, indexer/service/ports.py): stored
ids and vectors, perceptual hashes, the copies `cnclip index` meets and the similar-shots calibration —
SQL only (indexer/storage/sql/duplicate_rows.py, calibration_rows.py). The groups themselves are the
service's (indexer/service/duplicates.py). Every method takes the id of a collection the caller resolved."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from indexer.domain.duplicates import Calibration, FileCopy
from indexer.storage.sql import calibration_rows, duplicate_rows
from indexer.storage.sql.rows import ItemRows


class CatalogDuplicates:
    """Held by `SqlCatalog` as `duplicates`."""

    def __init__(self, rows: ItemRows) -> None:
        self.rows = rows
        self.engine = rows.engine

    def item_ids(self, collection_id: int) -> np.ndarray:
        return self.rows.ids(collection_id)

    def vectors(self, ids: np.ndarray | Sequence[int]) -> np.ndarray:
        return self.rows.vectors(ids)

    def changes(self, collection_id: int, since: int, until: int) -> tuple[np.ndarray, np.ndarray]:
        return self.rows.changes(collection_id, since, until)

    def item_count(self, collection_id: int) -> int:
        return calibration_rows.count_items(self.engine, collection_id)

    def hashed_items(self, collection_id: int) -> tuple[np.ndarray, np.ndarray]:
        return duplicate_rows.hashed_items(self.engine, collection_id)

    def phashes_of(self, ids: Sequence[int]) -> dict[int, int]:
        return duplicate_rows.phashes_of(self.engine, ids)

    def unhashed_ids(self, collection_id: int) -> list[int]:
        return duplicate_rows.unhashed_ids(self.engine, collection_id)

    def unhashed_count(self, collection_id: int) -> int:
        return duplicate_rows.unhashed_count(self.engine, collection_id)

    def set_phashes(self, collection_id: int, updates: Sequence[tuple[int, int]]) -> None:
        duplicate_rows.set_phashes(self.engine, collection_id, updates)

    def exif_times(self, collection_id: int) -> dict[int, float]:
        return calibration_rows.exif_times(self.engine, collection_id)

    def copies_by_item(self, collection_id: int) -> dict[int, list[FileCopy]]:
        return duplicate_rows.copies_by_item(self.engine, collection_id)

    def record_copies(self, collection_id: int, copies: Sequence[FileCopy]) -> None:
        duplicate_rows.record_copies(self.engine, collection_id, copies)

    def prune_copies(self, collection_id: int) -> int:
        return duplicate_rows.prune_copies(self.engine, collection_id)

    def calibration(self, collection_id: int) -> Calibration | None:
        return calibration_rows.load_calibration(self.engine, collection_id)

    def save_calibration(self, collection_id: int, calibration: Calibration) -> None:
        calibration_rows.save_calibration(self.engine, collection_id, calibration)
