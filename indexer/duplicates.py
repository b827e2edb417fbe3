"""Near-duplicate groups of an image collection, in three tiers labelled apart (docs/duplicates.md):

1. `identical`: the same bytes at several paths. One sha256 is one item, so this is an item and the
   other files with its bytes (`item_copies`, indexer/duplicate_rows.py), read fresh from SQL.
2. `resized`: the same picture re-encoded, resized or saved in another format: perceptual hashes at
   most `HAMMING_THRESHOLD` bits apart (indexer/perceptual.py) whose vectors also pass the
   similar-shots threshold (a hash alone mistakes flat pictures, e.g. one shape in two colours).
3. `similar`: similar shots: stored vectors at least the model's threshold apart (cosine,
   retrieval/relevance.py `duplicate_threshold`), searched through a temporary vector index
   (indexer/near_vectors.py). Each `resized` group takes part through its keeper only, so a picture is
   in one group of a tier and a resized copy is not shown again as a similar shot.

Groups are cliques (indexer/grouping.py): never chains; each member's score is against the keeper
(most pixels, then bytes, then metadata). Pages follow a stable order: tiers in the order above,
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
from typing import TYPE_CHECKING, Literal

import numpy as np

from indexer import duplicate_rows
from indexer.duplicate_pages import TIERS, Tier, TierChoice, check_page
from indexer.grouping import complete_linkage, group_order, keeper_order
from indexer.near_vectors import NEIGHBOURS, ShotSearch
from indexer.perceptual import HAMMING_THRESHOLD, hamming, near_pairs
from indexer.types import CollectionState, ItemRecord, TakenSource
from retrieval.errors import Overloaded
from retrieval.relevance import duplicate_threshold

if TYPE_CHECKING:
    from indexer.catalog import SqlCatalog

MAX_GROUP_SIZE = NEIGHBOURS // 2  # members, the keeper included (copies of one file are not capped)
CACHE_SIZE = 4
LOCK_WAIT_S = 30.0


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
    threshold: float  # cosine where similar shots start (raised when the pairs would outgrow memory)
    threshold_source: Literal["measured", "unmeasured", "setting", "request", "raised"]
    hamming_threshold: int
    max_group_size: int

    @property
    def has_more(self) -> bool:
        return self.offset + self.limit < self.total


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
    """Near-duplicate groups over a catalog (thread-safe; the collection service holds one)."""

    def __init__(self, catalog: SqlCatalog) -> None:
        self.catalog = catalog
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[int, float], _Snapshot] = OrderedDict()

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
        value, source = self._threshold(state.model, threshold, setting_threshold)
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            raise Overloaded("another duplicate search is running; retry in a moment", retry_after=5.0)
        try:
            deadline = None if budget_s is None else time.monotonic() + budget_s
            snapshot = self._snapshot(self.catalog.collection(state.name), value)
            for other in self._cache.values():
                if other is not snapshot:
                    other.shots.release()  # one index in memory at a time
            snapshot.shots.run(deadline)
            copies = duplicate_rows.copies_by_item(self.catalog.engine, state.id)
            tiers: dict[Tier, list[list[int]]] = {
                "identical": [[item_id] for item_id, _ in sorted(copies.items(), key=lambda c: (-len(c[1]), c[0]))],
                "resized": sorted(snapshot.resized_groups(), key=group_order),
                "similar": sorted(snapshot.similar_groups(), key=group_order),
            }
            shots = snapshot.shots
            complete, examined, searchable, used = shots.complete, shots.cursor, len(shots.ids), shots.threshold
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
            unhashed=duplicate_rows.unhashed_count(self.catalog.engine, state.id),
            threshold=round(used, 6),
            threshold_source="raised" if used > value else source,
            hamming_threshold=HAMMING_THRESHOLD,
            max_group_size=MAX_GROUP_SIZE,
        )

    @staticmethod
    def _threshold(
        model: str, requested: float | None, setting: float | None
    ) -> tuple[float, Literal["measured", "unmeasured", "setting", "request"]]:
        if requested is not None:
            return requested, "request"
        if setting is not None:  # CNCLIP_DUPLICATE_THRESHOLD: overrides the model's
            return setting, "setting"
        value, measured = duplicate_threshold(model)
        return value, "measured" if measured else "unmeasured"

    # --- the cached answer ------------------------------------------------------------------------
    def _snapshot(self, state: CollectionState, threshold: float) -> _Snapshot:
        key = (state.id, threshold)
        snapshot = self._cache.get(key)
        if snapshot is not None and snapshot.vector_key == state.vector_key:
            self._cache.move_to_end(key)
            if snapshot.version == state.version:
                return snapshot
            added, deleted = self.catalog.rows.changes(state.id, snapshot.version, state.version)
            if len(added) == 0:  # deletions only: the same groups, less the deleted members
                snapshot.removed.update(int(i) for i in deleted)
                snapshot.version = state.version
                return snapshot
        resized = self._resized(state.id, threshold)
        others = {i for group in resized for i in group[1:]}  # a resized group is searched through its keeper
        ids = np.array([i for i in self.catalog.rows.ids(state.id).tolist() if i not in others], dtype=np.int64)
        snapshot = _Snapshot(
            state.vector_key, state.version, resized, ShotSearch(ids, self.catalog.rows.vectors, threshold, state.dim)
        )
        self._cache[key] = snapshot
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return snapshot

    def _resized(self, collection_id: int, threshold: float) -> list[list[int]]:
        """Cliques of items with near hashes and vectors above the threshold, keeper first."""
        ids, hashes = duplicate_rows.hashed_items(self.catalog.engine, collection_id)
        positions, bits = near_pairs(hashes, HAMMING_THRESHOLD, bundle_cap=MAX_GROUP_SIZE)
        if len(positions) == 0:
            return []
        left, right = ids[positions[:, 0]], ids[positions[:, 1]]
        involved = np.unique(np.concatenate([left, right]))
        vectors = self.catalog.rows.vectors(involved)
        cosines = np.sum(vectors[np.searchsorted(involved, left)] * vectors[np.searchsorted(involved, right)], axis=1)
        # Nearer hashes first, then nearer vectors: the strength complete linkage merges by.
        pairs = {
            (a, b): (64 - d) + c
            for a, b, d, c in zip(left.tolist(), right.tolist(), bits.tolist(), cosines.tolist(), strict=True)
            if c >= threshold
        }
        groups = complete_linkage(pairs, MAX_GROUP_SIZE)
        records = {r.id: r for r in self.catalog.get_many([i for g in groups for i in g])}
        return [sorted((i for i in g if i in records), key=lambda i: keeper_order(records[i])) for g in groups]

    # --- one page ---------------------------------------------------------------------------------
    def _groups(
        self, page: Sequence[tuple[Tier, list[int]]], copies: dict[int, list[duplicate_rows.FileCopy]]
    ) -> list[DuplicateGroup]:
        """The page's groups with their members' records, keeper and scores, read now: a member
        deleted meanwhile is left out (and a group left with one member)."""
        ids = sorted({i for _, group in page for i in group})
        records = {r.id: r for r in self.catalog.get_many(ids)}
        present = np.array([i for i in ids if i in records], dtype=np.int64)
        vectors = dict(zip(present.tolist(), self.catalog.rows.vectors(present), strict=True))
        hashes = duplicate_rows.phashes_of(self.catalog.engine, present.tolist())
        groups: list[DuplicateGroup] = []
        for tier, group in page:
            if tier == "identical":
                item = records.get(group[0])
                if item is not None:
                    groups.append(_identical_group(item, copies.get(item.id, [])))
                continue
            kept = sorted((i for i in group if i in records), key=lambda i: keeper_order(records[i]))
            if len(kept) < 2:
                continue
            keeper = kept[0]
            members = [_member(records[i], i == keeper, vectors, hashes, keeper) for i in kept]
            members[1:] = sorted(members[1:], key=lambda m: (-m.score, m.item.id))
            groups.append(DuplicateGroup(tier, members))
        return groups


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


def _identical_group(item: ItemRecord, copies: list[duplicate_rows.FileCopy]) -> DuplicateGroup:
    """The item (its keeper: copies are files, not items) and the other files with its bytes."""
    members = [DuplicateMember(item, item.path, item.root, item.size, item.taken_at, item.taken_source, True, 1.0, 0)]
    for copy in copies:
        # A date read from the file's EXIF is the copy's too; a date from the item's mtime is not.
        taken, source = item.taken_at, item.taken_source
        if item.taken_source != "exif" and copy.mtime is not None:
            taken, source = datetime.fromtimestamp(copy.mtime, UTC), "mtime"
        members.append(DuplicateMember(item, copy.path, copy.root, copy.size, taken, source, False, 1.0, 0, copy=True))
    return DuplicateGroup("identical", members)
