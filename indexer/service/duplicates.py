"""Near-duplicate groups of an image collection, in three tiers labelled apart (docs/duplicates.md):

1. `identical`: the same bytes at several paths. One sha256 is one item, so this is an item and the
   other files with its bytes (`item_copies`, indexer/storage/sql/duplicate_rows.py), read fresh from SQL.
2. `resized`: the same picture re-encoded, resized or saved in another format: perceptual hashes at
   most `HAMMING_THRESHOLD` bits apart (indexer/domain/perceptual.py) whose vectors also pass the
   similar-shots threshold (a hash alone mistakes flat pictures, e.g. one shape in two colours).
3. `similar`: similar shots: stored vectors at least the threshold apart (cosine, calibrated on the
   collection with its model: indexer/service/duplicate_calibration.py; off when the model cannot separate
   shots from other photos there), searched through a temporary vector index
   (indexer/domain/near_vectors.py). Each `resized` group takes part through its keeper only, so a picture is
   in one group of a tier and a resized copy is not shown again as a similar shot.

Groups are cliques (indexer/domain/grouping.py): never chains; each member's score is against the keeper
(the original: indexer/service/keeper.py, with its reason). Pages follow a stable order: tiers in the order above,
then largest group first, then smallest id.

Computed once per collection version and cached (the last `CACHE_SIZE` answers: id lists only). A
version reached by deletions alone (the review page deleting members) reuses the answer, less the
deleted items; any other change computes it again. The similar-shots search runs for at most the
call's time budget and keeps its place: the answer is then partial (`complete` False) and the next
call goes on. One search runs at a time (a second caller waits up to `LOCK_WAIT_S`, then is told to
retry), and one holds its index at a time, so memory stays that of one collection's vectors.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial

import numpy as np

from indexer.domain.duplicate_pages import TIERS, Tier, TierChoice, check_page
from indexer.domain.duplicates import (
    Calibration,
    DuplicateGroup,
    DuplicateMember,
    DuplicatesPage,
    FileCopy,
    ThresholdSource,
)
from indexer.domain.grouping import complete_linkage, group_order, keeper_order
from indexer.domain.near_vectors import NEIGHBOURS, ShotSearch
from indexer.domain.perceptual import HAMMING_THRESHOLD, hamming, near_pairs
from indexer.domain.records import CollectionState, ItemRecord
from indexer.errors import MediaChanged
from indexer.service.keeper import PictureQuality, choose_keeper, picture_quality, recorded_quality
from indexer.service.ports import DuplicateStore, ItemLibrary
from retrieval.errors import NotFound, Overloaded
from retrieval.relevance import duplicate_threshold

MAX_GROUP_SIZE = NEIGHBOURS // 2  # members, the keeper included (copies of one file are not capped)
CACHE_SIZE = 4
QUALITY_CACHE = 4096  # members' measured qualities kept (by id and sha256)
LOCK_WAIT_S = 30.0


@dataclass
class _Snapshot:
    """What one collection version's answer is made of (ids only, apart from the search in progress)."""

    vector_key: str
    version: int
    resized: list[list[int]]  # keeper first
    shots: ShotSearch
    removed: set[int] = field(default_factory=set)  # deleted since `resized` and the pairs were found
    _similar: list[list[int]] = field(default_factory=list)
    _similar_key: tuple[int, int, int] = (-1, -1, -1)

    def resized_groups(self) -> list[list[int]]:
        return [kept for g in self.resized if len(kept := [i for i in g if i not in self.removed]) > 1]

    def similar_groups(self) -> list[list[int]]:
        key = (self.shots.cursor, len(self.shots.pairs), len(self.removed))
        if key != self._similar_key:
            self._similar = complete_linkage(self.shots.pairs, MAX_GROUP_SIZE, self.removed)
            self._similar_key = key
        return self._similar


class DuplicateFinder:
    """Near-duplicate groups of a library's collections, from what `store` keeps of them (thread-safe;
    the collection service's duplicate use cases hold one)."""

    def __init__(self, library: ItemLibrary, store: DuplicateStore) -> None:
        self.library = library
        self.store = store
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[int, float | None, float], _Snapshot] = OrderedDict()
        self._qualities: OrderedDict[tuple[int, str | None, bool], PictureQuality] = OrderedDict()
        self._qualities_lock = threading.Lock()

    def find(
        self,
        state: CollectionState,
        tier: TierChoice = "all",
        offset: int = 0,
        limit: int = 20,
        *,
        budget_s: float | None = None,
        threshold: float | None = None,
        setting_threshold: float | None = None,
    ) -> DuplicatesPage:
        """One page of the collection's groups (see the module docstring). `budget_s`: how long the
        similar-shots search may run now (None: until done)."""
        check_page(tier, offset, limit, budget_s, threshold)
        stored = self._calibration(state)
        value, source, note = self._threshold(state.model, threshold, setting_threshold, stored)
        # A resized pair must reach the similar-shots threshold; with the tier off, what edits of a photo score.
        gate = value if value is not None else (stored.resized_gate if stored and stored.resized_gate else 1.0)
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            raise Overloaded("another duplicate search is running; retry in a moment", retry_after=5.0)
        try:
            deadline = None if budget_s is None else time.monotonic() + budget_s
            snapshot = self._snapshot(self.library.collection(state.name), value, gate)
            for other in self._cache.values():
                if other is not snapshot:
                    other.shots.release()  # one index in memory at a time
            snapshot.shots.run(deadline)
            copies = self.store.copies_by_item(state.id)
            tiers: dict[Tier, list[list[int]]] = {
                "identical": [[item_id] for item_id, _ in sorted(copies.items(), key=lambda c: (-len(c[1]), c[0]))],
                "resized": sorted(snapshot.resized_groups(), key=group_order),
                "similar": sorted(snapshot.similar_groups(), key=group_order),
            }
            shots = snapshot.shots
            complete, examined, searchable = shots.complete, shots.cursor, len(shots.ids)
            used = shots.threshold if value is not None else None
        finally:
            self._lock.release()
        listing = [(t, group) for t in TIERS if tier in ("all", t) for group in tiers[t]]
        groups = self._groups(listing[offset : offset + limit], copies)
        return DuplicatesPage(
            collection=state.name,
            tier=tier,
            groups=groups,
            offset=offset,
            limit=limit,
            total=len(listing),
            counts={t: len(tiers[t]) for t in TIERS},
            complete=complete,
            examined=examined,
            searchable=searchable,
            unhashed=self.store.unhashed_count(state.id),
            threshold=None if used is None else round(used, 6),
            threshold_source="raised" if used is not None and value is not None and used > value else source,
            hamming_threshold=HAMMING_THRESHOLD,
            max_group_size=MAX_GROUP_SIZE,
            calibration=stored,
            similar_note=note,
            resized_gate=round(gate, 6),
        )

    def _calibration(self, state: CollectionState) -> Calibration | None:
        """The stored calibration when it was measured with the collection's current model."""
        stored = self.store.calibration(state.id)
        if stored is not None and (stored.model, stored.generation) != (state.model, state.generation):
            return None  # measured with another model: not this one's threshold
        return stored

    @staticmethod
    def _threshold(
        model: str, requested: float | None, setting: float | None, stored: Calibration | None
    ) -> tuple[float | None, ThresholdSource, str | None]:
        """(the similar-shots threshold or None when the tier is off, where it came from, a note): a
        request's, else CNCLIP_DUPLICATE_THRESHOLD, else the collection's calibration, else (never
        measured with this model: a process without it) the model's default."""
        if requested is not None:
            return requested, "request", None
        if setting is not None:  # CNCLIP_DUPLICATE_THRESHOLD: overrides the calibration
            return setting, "setting", None
        if stored is not None and stored.reason_code == "calibrated" and stored.threshold is not None:
            return stored.threshold, "calibrated", stored.reason
        if stored is not None and stored.reason_code == "overlap":
            return None, "off", stored.reason
        value, measured = duplicate_threshold(model)
        note = (
            stored.reason
            if stored is not None
            else "not calibrated on this collection yet (it needs the collection's model: the server, or "
            "`cnclip duplicates` with that model configured, measures it)"
        )
        return value, "measured" if measured else "unmeasured", note

    # --- the cached answer ------------------------------------------------------------------------
    def _snapshot(self, state: CollectionState, threshold: float | None, gate: float) -> _Snapshot:
        key = (state.id, threshold, gate)
        snapshot = self._cache.get(key)
        if snapshot is not None and snapshot.vector_key == state.vector_key:
            self._cache.move_to_end(key)
            if snapshot.version == state.version:
                return snapshot
            added, deleted = self.store.changes(state.id, snapshot.version, state.version)
            if len(added) == 0:  # deletions only: the same groups, less the deleted members
                snapshot.removed.update(int(i) for i in deleted)
                snapshot.version = state.version
                return snapshot
        resized = self._resized(state.id, gate)
        others = {i for group in resized for i in group[1:]}  # a resized group is searched through its keeper
        ids = np.array([i for i in self.store.item_ids(state.id).tolist() if i not in others], dtype=np.int64)
        if threshold is None:  # the similar tier is off: nothing to search
            ids, threshold = ids[:0], 1.0
        snapshot = _Snapshot(
            state.vector_key, state.version, resized, ShotSearch(ids, self.store.vectors, threshold, state.dim)
        )
        self._cache[key] = snapshot
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return snapshot

    def _resized(self, collection_id: int, threshold: float) -> list[list[int]]:
        """Cliques of items with near hashes and vectors above the threshold, keeper first."""
        ids, hashes = self.store.hashed_items(collection_id)
        positions, bits = near_pairs(hashes, HAMMING_THRESHOLD, bundle_cap=MAX_GROUP_SIZE)
        if len(positions) == 0:
            return []
        left, right = ids[positions[:, 0]], ids[positions[:, 1]]
        involved = np.unique(np.concatenate([left, right]))
        vectors = self.store.vectors(involved)
        cosines = np.sum(vectors[np.searchsorted(involved, left)] * vectors[np.searchsorted(involved, right)], axis=1)
        # Nearer hashes first, then nearer vectors: the strength complete linkage merges by.
        pairs = {
            (a, b): (64 - d) + c
            for a, b, d, c in zip(left.tolist(), right.tolist(), bits.tolist(), cosines.tolist(), strict=True)
            if c >= threshold
        }
        groups = complete_linkage(pairs, MAX_GROUP_SIZE)
        records = {r.id: r for r in self.library.get_many([i for g in groups for i in g])}
        return [sorted((i for i in g if i in records), key=lambda i: keeper_order(records[i])) for g in groups]

    # --- one page ---------------------------------------------------------------------------------
    def _groups(
        self, page: Sequence[tuple[Tier, list[int]]], copies: dict[int, list[FileCopy]]
    ) -> list[DuplicateGroup]:
        """The page's groups with their members' records, keeper and scores, read now: a member
        deleted meanwhile is left out (and a group left with one member)."""
        ids = sorted({i for _, group in page for i in group})
        records = {r.id: r for r in self.library.get_many(ids)}
        present = np.array([i for i in ids if i in records], dtype=np.int64)
        vectors = dict(zip(present.tolist(), self.store.vectors(present), strict=True))
        hashes = self.store.phashes_of(present.tolist())
        groups: list[DuplicateGroup] = []
        for tier, group in page:
            if tier == "identical":
                item = records.get(group[0])
                if item is not None:
                    groups.append(_identical_group(item, copies.get(item.id, [])))
                continue
            present_members = [records[i] for i in group if i in records]
            if len(present_members) < 2:
                continue
            # Detail (a decode per member) matters only when the members differ in size.
            detail = (
                len({(max(m.width or 0, m.height or 0), min(m.width or 0, m.height or 0)) for m in present_members}) > 1
            )
            ordered, reason = choose_keeper(present_members, partial(self._quality, detail=detail))
            keeper = ordered[0].id
            members = [_member(item, item.id == keeper, vectors, hashes, keeper) for item in ordered]
            members[1:] = sorted(members[1:], key=lambda m: (-m.score, m.item.id))
            groups.append(DuplicateGroup(tier, members, reason))
        return groups

    def _quality(self, item: ItemRecord, detail: bool) -> PictureQuality:
        """A member's measured quality (indexer/service/keeper.py), from its verified bytes, cached by id,
        sha256 and whether its detail was measured; what the catalog recorded when the bytes cannot
        be read."""
        key = (item.id, item.sha256, detail)
        with self._qualities_lock:
            found = self._qualities.get(key)
            if found is not None:
                self._qualities.move_to_end(key)
                return found
        try:
            data = self.library.read_media(item)
        except (NotFound, MediaChanged, OSError):
            return recorded_quality(item)
        found = picture_quality(data, item, detail=detail)
        with self._qualities_lock:
            self._qualities[key] = found
            while len(self._qualities) > QUALITY_CACHE:
                self._qualities.popitem(last=False)
        return found


def _member(
    item: ItemRecord, keeper: bool, vectors: dict[int, np.ndarray], hashes: dict[int, int], keeper_id: int
) -> DuplicateMember:
    score = 1.0 if keeper else float(np.dot(vectors[keeper_id], vectors[item.id]))
    bits = None
    if item.id in hashes and keeper_id in hashes:
        bits = int(hamming(np.array([hashes[item.id]]), np.array([hashes[keeper_id]]))[0])
    return DuplicateMember(
        item, item.path, item.root, item.size, item.taken_at, item.taken_source, keeper, round(score, 6), bits
    )


def _identical_group(item: ItemRecord, copies: list[FileCopy]) -> DuplicateGroup:
    """The item (its keeper: copies are files, not items) and the other files with its bytes."""
    members = [DuplicateMember(item, item.path, item.root, item.size, item.taken_at, item.taken_source, True, 1.0, 0)]
    for copy in copies:
        # A date read from the file's EXIF is the copy's too; a date from the item's mtime is not.
        taken, source = item.taken_at, item.taken_source
        if item.taken_source != "exif" and copy.mtime is not None:
            taken, source = datetime.fromtimestamp(copy.mtime, UTC), "mtime"
        members.append(DuplicateMember(item, copy.path, copy.root, copy.size, taken, source, False, 1.0, 0, copy=True))
    return DuplicateGroup("identical", members)
