"""The collection service's near-duplicate use cases (the groups themselves: indexer/service/duplicates.py):
list a collection's groups, hash images indexed before perceptual hashes existed, and record or
forget the copies `cnclip index` meets. Mixed into `CollectionService`, the one door to storage."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from indexer.domain.duplicate_pages import TierChoice
from indexer.domain.names import check_collection_name
from indexer.domain.perceptual import phash_of_bytes
from indexer.errors import MediaChanged
from indexer.service import duplicate_calibration
from indexer.service.duplicate_calibration import Calibration
from indexer.service.duplicates import DuplicatesPage
from indexer.service.use_cases import off_loop, warm
from indexer.storage.sql.duplicate_rows import FileCopy
from retrieval.errors import EncoderUnavailable, InvalidInput, NotFound

if TYPE_CHECKING:
    from indexer.domain.records import Catalog, CollectionInfo, CollectionKind, CollectionState, ItemRecord
    from retrieval.types import Encoder

CALIBRATION_BATCH = 32  # edited pictures per encoder call
_CALIBRATING = threading.Lock()  # one calibration at a time in a process (others answer without waiting)


class _Service(Protocol):
    """The parts of `CollectionService` (indexer/service/collections.py) these use cases build on."""

    catalog: Catalog
    duplicate_threshold: float | None
    duplicate_budget_s: float

    @staticmethod
    def check_kind(info: CollectionState, kind: CollectionKind, action: str) -> None: ...

    def _image_collection(self, name: str, action: str) -> str: ...

    def encoder_for(self, info: CollectionInfo | CollectionState) -> Encoder: ...

    async def _measure_calibration(self, target: str, encoder: Encoder) -> Calibration: ...


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
        """One page of a collection's near-duplicate groups (indexer/service/duplicates.py). `budget_s`: how long
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

    def duplicate_calibration(self: _Service, name: str) -> tuple[Calibration | None, str | None]:
        """(the stored similar-shots calibration, why it must be measured again or None when it holds)."""
        return self.catalog.duplicate_calibration(self._image_collection(name, "finding duplicates"))

    async def calibrate_duplicates(self: _Service, name: str, *, force: bool = False) -> Calibration | None:
        """Measure where similar shots start on this collection with its model
        (indexer/service/duplicate_calibration.py) when none is stored or the stored one is stale (`force`:
        always), and store it. Returns the calibration now stored (None: none, and this process does
        not run the collection's model, so the finder falls back to the model's default)."""
        target = self._image_collection(name, "finding duplicates")
        stored, stale = await off_loop(self.catalog.duplicate_calibration, target)
        if not force and (stale is None or self.duplicate_threshold is not None):
            return stored  # fresh, or CNCLIP_DUPLICATE_THRESHOLD decides anyway
        try:
            encoder = warm(self.encoder_for(self.catalog.collection(target)))
        except (EncoderUnavailable, InvalidInput):
            return stored
        if not _CALIBRATING.acquire(blocking=False):
            return stored  # another request measures it now; this one answers as things stand
        try:
            return await self._measure_calibration(target, encoder)
        finally:
            _CALIBRATING.release()

    async def _measure_calibration(self: _Service, target: str, encoder: Encoder) -> Calibration:
        records = await off_loop(self.catalog.calibration_sample, target)
        edited = await off_loop(_edited_pictures, self.catalog, records)
        flat = [(item_id, data) for item_id, pictures in edited for data in pictures]
        vectors: list[np.ndarray] = []
        for start in range(0, len(flat), CALIBRATION_BATCH):
            part = [data for _, data in flat[start : start + CALIBRATION_BATCH]]
            vectors.append(np.asarray(await encoder.embed_images(part), dtype=np.float32))
        stacked = np.concatenate(vectors) if vectors else np.empty((0, 0), np.float32)
        measured: list[tuple[int, np.ndarray]] = []
        row = 0
        for item_id, pictures in edited:
            measured.append((item_id, stacked[row : row + len(pictures)]))
            row += len(pictures)
        return await off_loop(self.catalog.finish_calibration, target, measured)

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
        """Files with the bytes of an item at another path (`cnclip index`; indexer/storage/sql/duplicate_rows.py)."""
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


def _edited_pictures(catalog: Catalog, records: list[ItemRecord]) -> list[tuple[int, list[bytes]]]:
    """(item id, its edited copies) for each record whose verified bytes decode; others are left out."""
    out: list[tuple[int, list[bytes]]] = []
    for record in records:
        try:
            data = catalog.read_media(record)
        except (NotFound, MediaChanged, OSError):
            continue
        image = duplicate_calibration.decode_for_edits(data)
        if image is None:
            continue
        try:
            out.append((record.id, duplicate_calibration.edits_of(image)))
        except (OSError, ValueError):  # a mode Pillow cannot turn into RGB: left out
            continue
    return out
