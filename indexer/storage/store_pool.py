"""This process's vector stores: one per collection, opened (and reconciled with SQL) on first use,
caught up with other processes' commits when a search sees the collection's version move.

A process that only writes SQL (`cnclip index`) opens none until its final flush, and a store it
cannot open because another process holds the engine's storage (a Milvus Lite file) is left to that
process: it catches up from SQL by itself (indexer/storage/sync.py).

A store that fails to open, catch up or search degrades its collection only (indexer/storage/store_health.py):
that collection answers `CollectionUnavailable` (503) and is opened again after a back-off; the
others are served, and a server starts whatever state one collection's files are in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from indexer.domain.names import collection_key
from indexer.domain.records import CollectionState
from indexer.errors import VectorStoreBusy, VectorStoreError
from indexer.storage.sql.rows import ItemRows
from indexer.storage.store_health import StoreHealth, is_collection_failure
from indexer.storage.sync import Progress, StoreSync
from indexer.storage.vectors.base import StoreSpec, VectorEngine
from retrieval.errors import CnclipError

log = logging.getLogger(__name__)


def store_spec(state: CollectionState) -> StoreSpec:
    """What the engine needs to know of a collection to hold its vectors."""
    return StoreSpec(state.id, state.name, state.dim, state.index, state.model, state.vector_key, state.generation)


class StorePool:
    """The open stores of one catalog, by collection id and by name key. Thread-safe."""

    def __init__(self, rows: ItemRows, engine: VectorEngine, sync_interval_s: float) -> None:
        self.rows = rows
        self.engine = engine
        self.sync_interval_s = sync_interval_s
        self._stores: dict[int, StoreSync] = {}  # collection id -> its open store
        self._by_key: dict[str, StoreSync] = {}  # collection_key(name) -> the same stores
        self._lock = threading.Lock()
        self.health = StoreHealth()  # the collections whose store failed (degraded)

    def held(self, collection_id: int) -> StoreSync | None:
        """The collection's store if this process has it open (never opens one)."""
        return self._stores.get(collection_id)

    def store(self, collection: str, vector_key: str | None = None) -> StoreSync:
        """The collection's store, opened (and reconciled) on first use, and caught up with other
        processes' commits when its version moved — checked at most every `sync_interval_s`, with
        one indexed query of two columns; at once when the caller expects another `vector_key` (a
        model generation swapped, indexer/storage/sql/generations.py)."""
        sync = self._by_key.get(collection_key(collection))
        if sync is None:
            return self.open(self.rows.collection(collection))
        expected = vector_key is None or vector_key == sync.state.vector_key
        if expected and time.monotonic() - sync.checked < self.sync_interval_s:
            return sync
        current = self.rows.version_of(collection)
        if current is None or current[0] != sync.state.vector_key:  # deleted, or deleted and made again
            self.forget(sync.state.id)
            return self.open(self.rows.collection(collection))
        if current[1] != sync.seen and sync.lock.acquire(blocking=False):
            # A search never waits for another thread's catch-up: it searches what is there.
            try:
                sync.catch_up(current[1])
            except Exception as exc:
                if not is_collection_failure(exc):
                    raise
                raise self.failed(sync, "update", exc) from exc
            finally:
                sync.lock.release()
        sync.checked = time.monotonic()
        return sync

    def open(self, state: CollectionState) -> StoreSync:
        """The store of `state`, opened and reconciled now unless it is open already.
        `CollectionUnavailable` while the collection is degraded and waits out its back-off."""
        with self._lock:
            sync = self._stores.get(state.id)
            if sync is None or sync.state.vector_key != state.vector_key:
                self.health.check(state.id)
                sync = self._new_store(state)
            return sync

    def failed(self, sync: StoreSync, stage: str, exc: BaseException) -> Exception:
        """Degrade the collection of `sync` after its store failed at `stage` (it is forgotten, and
        opened again from SQL after the back-off); returns the error to raise."""
        with self._lock:
            if self._stores.get(sync.state.id) is sync:
                self._forget_locked(sync.state.id)
        return self.health.failed(sync.state.id, sync.state.name, stage, exc)

    def forget(self, collection_id: int) -> None:
        """Drop the store this process holds of a collection (if any), and whether it was degraded."""
        with self._lock:
            self._forget_locked(collection_id)
        self.health.forget(collection_id)

    def _forget_locked(self, collection_id: int) -> None:
        sync = self._stores.pop(collection_id, None)
        if sync is not None and self._by_key.get(collection_key(sync.state.name)) is sync:
            self._by_key.pop(collection_key(sync.state.name))

    def after_write(self, collection_id: int, version: int | None) -> None:
        """This process's store of the collection (if open) catches up now: own writes are searchable
        when the call returns."""
        sync = self._stores.get(collection_id)
        if sync is None:
            return
        with sync.lock:
            if version is None:
                fresh = self.rows.collection_by_id(collection_id)
                version = fresh.version if fresh is not None else sync.seen
            try:
                sync.catch_up(version)
            except Exception as exc:
                if not is_collection_failure(exc):
                    raise
                # The write is committed in SQL: it stands; the store is opened again (and caught up) later.
                self.failed(sync, "update", exc)
                return
            sync.checked = time.monotonic()

    def rebuild(self, state: CollectionState, on_progress: Progress | None = None) -> int:
        """Drop the collection's engine data and fill it again from SQL; returns its vector count."""
        with self._lock:
            self._forget_locked(state.id)
            self.engine.drop(store_spec(state))
            return self._new_store(state, on_progress, reason="on request").store.count()

    def _new_store(
        self, state: CollectionState, on_progress: Progress | None = None, reason: str | None = None
    ) -> StoreSync:
        """Open the engine's store of `state`, reconcile it with SQL and hold it (with `_lock`). A
        failure degrades the collection (`CollectionUnavailable`; an engine's own error as it is)."""
        try:
            store = self.engine.open(store_spec(state), self.rows.vectors, lambda f: self.rows.filter_ids(state.id, f))
            sync = StoreSync(self.rows, store, state)
            with sync.lock:  # every caller read `state` from SQL just before: its version is fresh enough
                sync.reconcile(on_progress, reason, version=state.version)
                sync.checked = time.monotonic()
        except Exception as exc:
            if not is_collection_failure(exc):
                raise
            unavailable = self.health.failed(state.id, state.name, "open", exc)
            if isinstance(exc, CnclipError):
                raise  # the engine's own error keeps its status (a Milvus too old: 501)
            raise unavailable from exc
        self.health.recovered(state.id)
        self._stores[state.id] = sync
        self._by_key[collection_key(state.name)] = sync
        return sync

    def flush(self, collection_ids: Iterable[int]) -> None:
        """Bring these collections' stores up to date and save them. A store that another process
        holds (a Milvus Lite file) is left to it: it catches up from SQL by itself."""
        for collection_id in sorted(set(collection_ids)):
            state = self.rows.collection_by_id(collection_id)
            if state is None:
                continue
            try:
                sync = self._stores.get(collection_id) or self.open(state)
            except VectorStoreBusy as exc:
                log.warning("%s; it catches up from SQL within CNCLIP_SYNC_INTERVAL_S", exc.message)
                return
            except VectorStoreError:  # degraded (logged): SQL holds its writes, its store catches up later
                continue
            with sync.lock:
                try:
                    sync.catch_up(state.version)
                except Exception as exc:
                    if not is_collection_failure(exc):
                        raise
                    self.failed(sync, "update", exc)
                    continue
            sync.store.save()

    def close(self) -> None:
        """Close every open store (each saves what it holds)."""
        with self._lock:
            stores, self._stores, self._by_key = list(self._stores.values()), {}, {}
        for sync in stores:
            sync.store.close()
