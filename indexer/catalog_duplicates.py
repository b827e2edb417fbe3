"""The catalog's part of near-duplicate groups (indexer/duplicates.py): perceptual hashes, the copies
`cnclip index` meets, and the finder that groups them — SQL work behind the `Catalog` protocol, so
that the collection service stays the only caller."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import Engine

from indexer import duplicate_rows
from indexer.duplicate_pages import TierChoice
from indexer.duplicates import DuplicateFinder, DuplicatesPage

if TYPE_CHECKING:
    from indexer.types import CollectionState


class _Catalog(Protocol):
    engine: Engine

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
