"""The collection service's near-duplicate use cases (the groups themselves: indexer/service/duplicates.py):
list a collection's groups, measure the similar-shots calibration, hash images indexed before
perceptual hashes existed, and record or forget the copies `cnclip index` meets. Held by
`CollectionService` as `duplicates`, over the ports it needs (indexer/service/ports.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from indexer.domain.duplicate_pages import TierChoice
from indexer.domain.duplicates import Calibration, DuplicatesPage, FileCopy
from indexer.domain.names import check_collection_name
from indexer.domain.perceptual import phash_of_bytes
from indexer.domain.records import CollectionKind, CollectionState, ItemRecord
from indexer.errors import MediaChanged
from indexer.service import duplicate_calibration
from indexer.service.blocking import off_loop, warm
from indexer.service.duplicates import DuplicateFinder
from indexer.service.ports import DuplicateStore, ItemLibrary
from retrieval.errors import EncoderUnavailable, InvalidInput, NotFound
from retrieval.types import Encoder

CALIBRATION_BATCH = 32  # edited pictures per encoder call
_CALIBRATING = threading.Lock()  # one calibration at a time in a process (others answer without waiting)

EncoderFor = Callable[[CollectionState], Encoder]  # the encoder of a collection's model (MigrationCases)
KindCheck = Callable[[CollectionState, CollectionKind, str], None]  # indexer/service/resolver.py `check_kind`


class DuplicateCases:
    """Near-duplicate use cases over `library` (collections, items, their bytes) and `store` (hashes,
    copies, calibrations). `encoder_for` picks the collection's model for a calibration;
    `threshold` is CNCLIP_DUPLICATE_THRESHOLD (None: the calibration's or the model's) and `budget_s`
    CNCLIP_DUPLICATE_TIME_BUDGET_S."""

    def __init__(
        self,
        library: ItemLibrary,
        store: DuplicateStore,
        encoder_for: EncoderFor,
        check_kind: KindCheck,
        *,
        threshold: float | None = None,
        budget_s: float = 10.0,
    ) -> None:
        self.library = library
        self.store = store
        self.encoder_for = encoder_for
        self.check_kind = check_kind
        self.threshold = threshold
        self.budget_s = budget_s
        self.finder = DuplicateFinder(library, store)  # its cache and its lock: one search at a time

    def page(
        self,
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
        budget = self.budget_s if budget_s is not None and budget_s < 0 else budget_s
        return self.finder.find(
            target, tier, offset, limit, budget_s=budget, threshold=threshold, setting_threshold=self.threshold
        )

    def calibration(self, name: str) -> tuple[Calibration | None, str | None]:
        """(the stored similar-shots calibration, why it must be measured again or None when it holds)."""
        return self._calibration(self._image_collection(name, "finding duplicates"))

    def _calibration(self, state: CollectionState) -> tuple[Calibration | None, str | None]:
        stored = self.store.calibration(state.id)
        return stored, duplicate_calibration.stale_reason(stored, state, self.store.item_count(state.id))

    async def calibrate(self, name: str, *, force: bool = False) -> Calibration | None:
        """Measure where similar shots start on this collection with its model
        (indexer/service/duplicate_calibration.py) when none is stored or the stored one is stale (`force`:
        always), and store it. Returns the calibration now stored (None: none, and this process does
        not run the collection's model, so the finder falls back to the model's default)."""
        target = self._image_collection(name, "finding duplicates")
        stored, stale = await off_loop(self._calibration, target)
        if not force and (stale is None or self.threshold is not None):
            return stored  # fresh, or CNCLIP_DUPLICATE_THRESHOLD decides anyway
        try:
            encoder = warm(self.encoder_for(self.library.collection(target.name)))
        except (EncoderUnavailable, InvalidInput):
            return stored
        if not _CALIBRATING.acquire(blocking=False):
            return stored  # another request measures it now; this one answers as things stand
        try:
            return await self._measure(target.name, encoder)
        finally:
            _CALIBRATING.release()

    async def _measure(self, name: str, encoder: Encoder) -> Calibration:
        state = await off_loop(self.library.collection, name)
        sample = duplicate_calibration.sample_ids(self.store.item_ids(state.id))
        records = await off_loop(self.library.get_many, [int(i) for i in sample])
        edited = await off_loop(_edited_pictures, self.library, records)
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
        state = await off_loop(self.library.collection, name)
        return await off_loop(duplicate_calibration.finish, state, measured, self.store)

    def set_phashes(self, name: str, updates: Sequence[tuple[int, int]]) -> None:
        """Perceptual hashes of photos indexed before they existed (`cnclip index` reads their files again)."""
        self.store.set_phashes(self._image_collection(name, "hashing").id, updates)

    def hash_missing(self, name: str, on_progress: Callable[[int, int], None] | None = None, chunk: int = 200) -> int:
        """Perceptual hashes of every image that has none, uploads included (`cnclip duplicates
        --hash-missing`), read from the verified indexed bytes; an image whose file is gone or changed is
        left as it is. Returns how many were hashed."""
        target = self._image_collection(name, "hashing")
        missing = self.store.unhashed_ids(target.id)
        hashed = 0
        for start in range(0, len(missing), chunk):
            updates = []
            for record in self.library.get_many(missing[start : start + chunk]):
                try:
                    phash = phash_of_bytes(self.library.read_media(record))
                except (NotFound, MediaChanged):
                    continue
                if phash is not None:
                    updates.append((record.id, phash))
            if updates:
                self.store.set_phashes(target.id, updates)
            hashed += len(updates)
            if on_progress:
                on_progress(min(start + chunk, len(missing)), len(missing))
        return hashed

    def record_copies(self, name: str, copies: Sequence[FileCopy]) -> None:
        """Files with the bytes of an item at another path (`cnclip index`; indexer/storage/sql/duplicate_rows.py)."""
        self.store.record_copies(self._image_collection(name, "recording copies").id, copies)

    def prune_copies(self, name: str) -> int:
        """Forget recorded copies whose files are gone (`cnclip index --prune`)."""
        return self.store.prune_copies(self._image_collection(name, "pruning copies").id)

    def _image_collection(self, name: str, action: str) -> CollectionState:
        """The image collection `name`. Hashes and copies need no model: a process that runs none
        (`cnclip duplicates`) may record them."""
        state = self.library.collection(check_collection_name(name))
        self.check_kind(state, "images", action)
        return state


def _edited_pictures(library: ItemLibrary, records: list[ItemRecord]) -> list[tuple[int, list[bytes]]]:
    """(item id, its edited copies) for each record whose verified bytes decode; others are left out."""
    out: list[tuple[int, list[bytes]]] = []
    for record in records:
        try:
            data = library.read_media(record)
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
