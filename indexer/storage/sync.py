"""Keeping a collection's vector store equal to SQL, in this process and across processes.

`reconcile` (when a store is opened): compare the store's ids with SQL's (count, max id, checksum,
then the sets), remove what SQL no longer has, add what it lacks from the stored vectors, and say
in one log line what was repaired. `catch_up(version)` (after a write, or when a search sees that the
collection's version moved): apply only the changes of the versions in (seen, version] — the rows
added with those versions and the deletions logged with them (indexer/storage/sql/rows.py). Both are
idempotent, because stores ignore ids they hold already and removals of ids they lack: a change
seen twice (a reconcile racing a commit) does no harm, and a change is never missed, because SQL
commits a collection's versions in order.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from indexer.domain.records import CollectionState, Progress
from indexer.storage.sql.rows import ItemRows
from indexer.storage.vectors.base import VectorStore, id_checksum

log = logging.getLogger(__name__)

CHUNK = 20_000  # vectors fetched from SQL per step when a store is filled


def _summary(ids: np.ndarray) -> tuple[int, int, int]:
    return len(ids), int(ids[-1]) if len(ids) else 0, id_checksum(ids)


class StoreSync:
    """One collection's store and the SQL version it has caught up to."""

    def __init__(self, rows: ItemRows, store: VectorStore, state: CollectionState) -> None:
        self.rows = rows
        self.store = store
        self.state = state
        self.seen = -1  # no version applied yet: reconcile first
        self.checked = 0.0  # monotonic time of the last version check
        self.lock = threading.Lock()  # one reconcile / catch-up at a time

    def reconcile(
        self, on_progress: Progress | None = None, reason: str | None = None, *, version: int | None = None
    ) -> None:
        """Make the store hold exactly SQL's ids (call with `lock` held). `reason`: why the store
        is being rebuilt, when the caller emptied it on purpose (`cnclip reindex`), to be logged
        instead of what the empty store itself says ("no index file"). `version`: the collection's
        version the caller read just now (any version read before the ids will do: catching up from
        it again is harmless); None: read here."""
        if version is None:
            fresh = self.rows.collection_by_id(self.state.id)
            version = fresh.version if fresh is not None else self.state.version  # read before the ids
        sql_ids = self.rows.ids(self.state.id)
        held, copies = np.unique(np.asarray(self.store.ids(), dtype=np.int64), return_counts=True)
        doubled = held[copies > 1]  # an engine killed mid-write may replay a row twice: drop, add once
        store_ids = np.setdiff1d(held, doubled)
        problem = reason or getattr(self.store, "problem", None)
        if len(doubled):
            self.store.remove(doubled)
            problem = f"{len(doubled)} ids held twice"
        if _summary(store_ids) == _summary(sql_ids) and np.array_equal(store_ids, sql_ids) and not problem:
            self.seen = version
            return
        started = time.perf_counter()
        stale = np.setdiff1d(store_ids, sql_ids)
        missing = np.setdiff1d(sql_ids, store_ids)
        self.store.remove(stale)
        self._add(missing, on_progress)
        self.store.save()
        self.seen = version
        log.info(
            "collection %s: vector store %s from SQL%s: %d added, %d removed (count/max id/checksum %s -> %s) in %.1f s",
            self.state.name, "rebuilt" if problem else "caught up", f" ({problem})" if problem else "",
            len(missing), len(stale), _summary(store_ids), _summary(sql_ids), time.perf_counter() - started,
        )  # fmt: skip

    def catch_up(self, version: int) -> int:
        """Apply the changes of versions (seen, version]; returns how many ids it touched (call with
        `lock` held)."""
        if version <= self.seen:
            return 0
        added, deleted = self.rows.changes(self.state.id, self.seen, version)
        self.store.remove(deleted)
        added = np.setdiff1d(added, deleted)  # added and deleted since: gone already
        self._add(added)
        self.seen = version
        return len(added) + len(deleted)

    def _add(self, ids: np.ndarray, on_progress: Progress | None = None) -> None:
        for start in range(0, len(ids), CHUNK):
            part = ids[start : start + CHUNK]
            vectors = self.rows.vectors(part)
            kept = np.any(vectors != 0, axis=1)  # a row deleted since: its deletion is applied next
            if not kept.all():
                part, vectors = part[kept], vectors[kept]
            self.store.upsert(part, vectors, self.rows.attrs(part))
            if on_progress:
                on_progress(min(start + CHUNK, len(ids)), len(ids))
