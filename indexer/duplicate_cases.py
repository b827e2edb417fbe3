"""The collection service's near-duplicate use cases (the groups themselves: indexer/duplicates.py):
list a collection's groups, hash images indexed before perceptual hashes existed, and record or
forget the copies `cnclip index` meets. Mixed into `CollectionService`, the one door to storage."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from indexer.duplicate_pages import TierChoice
from indexer.duplicate_rows import FileCopy
from indexer.duplicates import DuplicatesPage
from indexer.errors import MediaChanged
from indexer.names import check_collection_name
from indexer.perceptual import phash_of_bytes
from retrieval.errors import NotFound

if TYPE_CHECKING:
    from indexer.types import Catalog, CollectionKind, CollectionState


class _Service(Protocol):
    """The parts of `CollectionService` (indexer/service.py) these use cases build on."""

    catalog: Catalog
    duplicate_threshold: float | None
    duplicate_budget_s: float

    @staticmethod
    def check_kind(info: CollectionState, kind: CollectionKind, action: str) -> None: ...

    def _image_collection(self, name: str, action: str) -> str: ...


class DuplicateCases:
    duplicate_threshold: float | None = None  # CNCLIP_DUPLICATE_THRESHOLD (None: the model's)
    duplicate_budget_s: float = 10.0  # CNCLIP_DUPLICATE_TIME_BUDGET_S

    def duplicates(
        self: _Service,
        name: str,
        tier: TierChoice = "all",
        offset: int = 0,
        limit: int = 20,
        *,
        budget_s: float | None = -1.0,
        threshold: float | None = None,
    ) -> DuplicatesPage:
        """One page of a collection's near-duplicate groups (indexer/duplicates.py). `budget_s`: how long
        the similar-shots search may run in this call (the service's default when negative; None: until
        done); past it the answer is partial (`complete` False) and the next call goes on from there.
        Read-only: the groups come from stored vectors and hashes, whatever model this process runs."""
        target = self._image_collection(name, "finding duplicates")
        budget = self.duplicate_budget_s if budget_s is not None and budget_s < 0 else budget_s
        return self.catalog.find_duplicates(
            target,
            tier,
            offset,
            limit,
            budget_s=budget,
            threshold=threshold,
            setting_threshold=self.duplicate_threshold,
        )

    def set_phashes(self: _Service, name: str, updates: Sequence[tuple[int, int]]) -> None:
        """Perceptual hashes of photos indexed before they existed (`cnclip index` reads their files again)."""
        self.catalog.set_phashes(self._image_collection(name, "hashing"), updates)

    def hash_missing(
        self: _Service, name: str, on_progress: Callable[[int, int], None] | None = None, chunk: int = 200
    ) -> int:
        """Perceptual hashes of every image that has none, uploads included (`cnclip duplicates
        --hash-missing`), read from the verified indexed bytes; an image whose file is gone or changed is
        left as it is. Returns how many were hashed."""
        target = self._image_collection(name, "hashing")
        missing = self.catalog.unhashed_ids(target)
        hashed = 0
        for start in range(0, len(missing), chunk):
            updates = []
            for record in self.catalog.get_many(missing[start : start + chunk]):
                try:
                    phash = phash_of_bytes(self.catalog.read_media(record))
                except (NotFound, MediaChanged):
                    continue
                if phash is not None:
                    updates.append((record.id, phash))
            if updates:
                self.catalog.set_phashes(target, updates)
            hashed += len(updates)
            if on_progress:
                on_progress(min(start + chunk, len(missing)), len(missing))
        return hashed

    def record_copies(self: _Service, name: str, copies: Sequence[FileCopy]) -> None:
        """Files with the bytes of an item at another path (`cnclip index`; indexer/duplicate_rows.py)."""
        self.catalog.record_copies(self._image_collection(name, "recording copies"), copies)

    def prune_copies(self: _Service, name: str) -> int:
        """Forget recorded copies whose files are gone (`cnclip index --prune`)."""
        return self.catalog.prune_copies(self._image_collection(name, "pruning copies"))

    def _image_collection(self: _Service, name: str, action: str) -> str:
        """The image collection `name` (its stored spelling). Hashes and copies need no model: a
        process that runs none (`cnclip duplicates`) may record them."""
        state = self.catalog.collection(check_collection_name(name))
        self.check_kind(state, "images", action)
        return state.name
