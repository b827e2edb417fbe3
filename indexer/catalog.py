"""The catalog: SQL (indexer/rows.py) is the source of truth, a vector engine (FAISS or Milvus,
indexer/vector_store.py) the derived search structure, kept equal to SQL by indexer/sync.py.

Write protocol: one SQL transaction commits the rows, their vectors and the collection's new
version; then this process's store of that collection, if it has one open, catches up. Other
processes notice the new version within `sync_interval_s` (one indexed query, before a search)
and catch up too. A crash anywhere leaves SQL complete and a store that lacks or still has some
ids; opening the store reconciles it. Stores are opened on first use, so a process that only
writes (`cnclip index`) never needs the engine until it flushes at the end.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine

from indexer.index_spec import parse_index
from indexer.media import media_root
from indexer.media_check import read_media
from indexer.media_sweep import SweepResult, sweep_media
from indexer.names import check_collection_name, collection_key
from indexer.rows import ItemRows
from indexer.sql_values import naive_utc, text_sha
from indexer.sync import Progress, StoreSync
from indexer.taken import set_taken
from indexer.types import (
    AddResult,
    CollectionInfo,
    CollectionKind,
    CollectionState,
    FileState,
    Hit,
    ItemRecord,
    NewImage,
    NewText,
    SearchFilters,
    TakenSource,
)
from indexer.vector_store import StoreSpec, VectorEngine, VectorStoreBusy
from retrieval.errors import Conflict, InvalidInput, NotFound
from retrieval.manifest import same_model
from retrieval.preprocess import probe_image

__all__ = ["FileState", "SqlCatalog"]

log = logging.getLogger(__name__)


def unit_vectors(vectors: np.ndarray, count: int, dim: int) -> np.ndarray:
    array = np.asarray(vectors, dtype=np.float32)
    if array.shape != (count, dim):
        raise InvalidInput(f"expected vectors of shape ({count}, {dim}), got {array.shape}")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    if not np.all(np.isfinite(array)) or np.any(norms == 0):
        raise InvalidInput("vectors must be finite and non-zero")
    return np.ascontiguousarray(array / norms, dtype=np.float32)


def _spec(state: CollectionState) -> StoreSpec:
    return StoreSpec(state.id, state.name, state.dim, state.factory, state.model, state.vector_key)


class SqlCatalog:
    """`indexer.types.Catalog` over SQLAlchemy (SQLite or PostgreSQL) and a `VectorEngine`."""

    def __init__(
        self,
        engine: Engine,
        data_dir: Path,
        vectors: VectorEngine,
        *,
        sync_interval_s: float = 0.5,
        max_image_bytes: int = 20 * 1024 * 1024,
        max_image_pixels: int = 50_000_000,
    ) -> None:
        self.engine = engine
        self.data_dir = Path(data_dir)
        self.media_dir = media_root(self.data_dir)
        self.rows = ItemRows(engine, self.media_dir)
        self.vectors = vectors
        self.sync_interval_s = sync_interval_s
        self.max_image_bytes = max_image_bytes
        self.max_image_pixels = max_image_pixels
        self._stores: dict[int, StoreSync] = {}  # collection id -> its open store
        self._by_key: dict[str, StoreSync] = {}  # collection_key(name) -> the same stores
        self._stores_lock = threading.Lock()
        self._written: set[int] = set()  # collections this process wrote (flushed on close)
        self._closed = False

    # --- collections -------------------------------------------------------------------------
    def create_collection(
        self, name: str, kind: CollectionKind, model: str, dim: int, index: str = "Flat"
    ) -> CollectionInfo:
        """A new empty collection; `Conflict` if the name is taken (case-insensitively). The index
        description is parsed (indexer/index_spec.py) and stored in its one spelling."""
        check_collection_name(name)
        if kind not in ("images", "texts"):
            raise InvalidInput("kind must be 'images' or 'texts'")
        if dim < 1 or not model:
            raise InvalidInput("a collection needs a model id and a positive dim")
        description = parse_index(index, dim).description  # before any engine sees the text
        self.vectors.validate(description, dim)  # the engine's own limits (Milvus: dimensions)
        state = self.rows.create_collection(name, kind, model, dim, description)
        return self._info(state, 0)

    def ensure_collection(
        self, name: str, kind: CollectionKind, model: str, dim: int, index: str | None = None
    ) -> CollectionInfo:
        """The collection `name`, created if missing; `Conflict` if it holds another kind, model or dim."""
        try:
            info = self.get_collection(name)
        except NotFound:
            try:
                return self.create_collection(name, kind, model, dim, "Flat" if index is None else index)
            except Conflict:  # another process created it just now
                info = self.get_collection(name)
        if (info.kind, info.dim) != (kind, dim) or not same_model(info.model, model):
            raise Conflict(
                f"collection {info.name!r} holds {info.kind} embedded with model {info.model!r} (dim {info.dim}); "
                f"this needs {kind} with model {model!r} (dim {dim}). Use another collection name."
            )
        return info

    def delete_collection(self, name: str) -> int:
        """Delete collection `name` with all its items and its vectors; returns how many items it held."""
        state = self.rows.collection(name)
        count = self.rows.item_counts(state.id).get(state.id, 0)
        self.rows.drop_collection(state.id)
        with self._stores_lock:
            if state.id in self._stores:
                self._forget(self._stores[state.id])
        self._written.discard(state.id)
        self.vectors.drop(_spec(state))
        return count

    def state(self, name: str) -> CollectionState:
        return self.rows.collection(name)

    def get_collection(self, name: str) -> CollectionInfo:
        state = self.rows.collection(name)
        return self._info(state, self.rows.item_counts(state.id).get(state.id, 0))

    def list_collections(self) -> list[CollectionInfo]:
        counts = self.rows.item_counts()
        return [self._info(state, counts.get(state.id, 0)) for state in self.rows.collections()]

    def default_collection(self, kind: CollectionKind) -> CollectionInfo | None:
        """The collection searches use when the request names none: the only one, or the oldest."""
        state = next((s for s in self.rows.collections() if s.kind == kind), None)
        return self.get_collection(state.name) if state is not None else None

    def remembered_deletions(self, collection: str) -> set[str]:
        return self.rows.remembered_deletions(self.rows.collection(collection).id)

    def forget_deletions(self, collection: str) -> int:
        return self.rows.forget_deletions(self.rows.collection(collection).id)

    def remembered_count(self, collection: str) -> int:
        return self.rows.remembered_count(self.rows.collection(collection).id)

    def _info(self, state: CollectionState, items: int) -> CollectionInfo:
        sync = self._stores.get(state.id)
        return CollectionInfo(
            id=state.id,
            name=state.name,
            kind=state.kind,
            model=state.model,
            dim=state.dim,
            index=state.factory,
            items=items,
            vectors=sync.store.count() if sync is not None else items,
            created_at=state.created_at,
        )

    # --- writes ----------------------------------------------------------------------------------
    def add_images(
        self,
        collection: str,
        images: Sequence[NewImage],
        vectors: np.ndarray,
        *,
        model: str | None = None,
        replace: Sequence[int | None] | None = None,
    ) -> list[AddResult]:
        """Add images with their vectors; an image whose bytes the collection has already is not added
        again (`created=False`, the existing id). `replace[i]` names a row this image supersedes (a
        changed file), deleted in the same transaction."""
        rows: list[dict[str, Any]] = []
        for image in images:
            sha = image.sha256 or hashlib.sha256(image.data).hexdigest()
            width: int | None
            height: int | None
            if image.mime is None:
                mime, width, height = probe_image(image.data, self.max_image_bytes, self.max_image_pixels)
            else:
                mime, width, height = image.mime, image.width, image.height
            fields: dict[str, Any] = {"path": image.path, "root": image.root, "sha256": sha, "size": len(image.data)}
            fields.update(mime=mime, width=width, height=height, caption=image.caption, mtime=image.mtime)
            fields.update(
                taken_at=naive_utc(image.taken_at) if image.taken_at else None, taken_source=image.taken_source
            )
            fields.update(phash=image.phash)
            rows.append({**fields, "tags": list(image.tags), "extra": dict(image.extra), "data": image.data})
        return self._add(collection, "images", rows, vectors, model, replace)

    def add_texts(
        self, collection: str, texts: Sequence[NewText], vectors: np.ndarray, *, model: str | None = None
    ) -> list[AddResult]:
        """Add texts with their vectors; a text the collection has already is not added again."""
        rows: list[dict[str, Any]] = []
        for text in texts:
            if not text.text.strip():
                raise InvalidInput("texts must not be empty")
            rows.append(
                {
                    "sha256": text_sha(text.text),
                    "caption": text.text,
                    "tags": list(text.tags),
                    "extra": dict(text.extra),
                }
            )
        return self._add(collection, "texts", rows, vectors, model, None)

    def _add(
        self,
        collection: str,
        kind: str,
        rows: list[dict[str, Any]],
        vectors: np.ndarray,
        model: str | None,
        replace: Sequence[int | None] | None,
    ) -> list[AddResult]:
        state = self.rows.collection(collection)
        if state.kind != kind:
            noun = "images" if kind == "images" else "texts"
            raise InvalidInput(f"collection {state.name!r} holds {state.kind}; {noun} go into an {kind} collection")
        if model is not None and not same_model(state.model, model):
            raise Conflict(f"collection {state.name!r} holds vectors of model {state.model!r}, not {model!r}")
        unit = unit_vectors(vectors, len(rows), state.dim)
        results, version = self.rows.add(state, rows, unit, replace)
        self._after_write(state.id, version)
        return results

    def update_files(self, collection: str, moves: Sequence[tuple[int, str, int, float]]) -> None:
        """Record (item id, new path, size, mtime) for files renamed or touched without new content."""
        self.rows.update_files(self.rows.collection(collection).id, moves)

    def set_taken(self, collection: str, updates: Sequence[tuple[int, datetime, TakenSource]]) -> None:
        """Record when photos already in the collection were taken (the backfill, indexer/taken.py)."""
        state = self.rows.collection(collection)
        self._after_write(state.id, set_taken(self.engine, state.id, updates))

    def delete(self, item_ids: Sequence[int], *, reason: str = "user", remember: bool | None = None) -> int:
        """Delete items (any collections); returns how many existed. A user's deletion (the default)
        is remembered: `cnclip index` does not bring the same bytes back. Upload copies go with
        their last row."""
        removed = self.rows.delete(item_ids, reason, reason == "user" if remember is None else remember)
        for collection_id in removed:
            self._after_write(collection_id, None)
        return sum(removed.values())

    def _after_write(self, collection_id: int, version: int | None) -> None:
        """This process's store of the collection (if open) catches up now: own writes are searchable
        when the call returns."""
        self._written.add(collection_id)
        sync = self._stores.get(collection_id)
        if sync is None:
            return
        with sync.lock:
            if version is None:
                fresh = self.rows.collection_by_id(collection_id)
                version = fresh.version if fresh is not None else sync.seen
            sync.catch_up(version)
            sync.checked = time.monotonic()

    # --- reads -------------------------------------------------------------------------------------
    def get(self, item_id: int) -> ItemRecord:
        records = self.get_many([item_id])
        if not records:
            raise NotFound(f"no item with id {item_id}")
        return records[0]

    def get_many(self, item_ids: Sequence[int]) -> list[ItemRecord]:
        """Records in the order of `item_ids`; ids that do not exist are left out."""
        return self.rows.get_many(item_ids)

    def vector(self, item_id: int) -> np.ndarray:
        """The stored vector of an item (for "similar images" by id)."""
        self.get(item_id)
        return self.rows.vectors([item_id])[0]

    def media_bytes(self, item_id: int) -> bytes:
        """The item's image bytes, if they are still the indexed ones (`indexer.media_check`: read once
        from a descriptor reached without leaving the indexed folder, sha256 checked); uploads are
        read from their copy under `data_dir/media`."""
        return read_media(self.get(item_id), self.media_dir)

    def file_states(self, collection: str) -> dict[str, FileState]:
        """Path -> state of every bulk-indexed file of the collection (for incremental runs)."""
        return self.rows.file_states(self.rows.collection(collection).id)

    def content_index(self, collection: str) -> dict[str, tuple[int, str | None]]:
        """sha256 -> (item id, path) of every item of the collection (dedupe and rename detection)."""
        return self.rows.content_index(self.rows.collection(collection).id)

    def index_ids(self, collection: str) -> np.ndarray:
        """The ids in the collection's vector store, sorted (tests and stats compare them with SQL)."""
        return np.sort(self.store(collection).store.ids())

    def sql_ids(self, collection: str) -> np.ndarray:
        return self.rows.ids(self.rows.collection(collection).id)

    # --- search ------------------------------------------------------------------------------------
    def search(self, collection: str, vector: np.ndarray, k: int, filters: SearchFilters | None = None) -> list[Hit]:
        """The `k` items most similar to `vector` (cosine), restricted by `filters`, best first."""
        if k < 1:
            raise InvalidInput("k must be at least 1")
        sync = self.store(collection)
        query = unit_vectors(np.asarray(vector, dtype=np.float32).reshape(1, -1), 1, sync.state.dim)[0]
        ids, scores = sync.store.search(query, k, filters)
        return [Hit(int(i), float(s)) for i, s in zip(ids, scores, strict=True)]

    def store(self, collection: str) -> StoreSync:
        """The collection's store, opened (and reconciled) on first use, and caught up with other
        processes' commits when its version moved — checked at most every `sync_interval_s`, with
        one indexed query of two columns."""
        sync = self._by_key.get(collection_key(collection))
        if sync is None:
            return self._open_store(self.rows.collection(collection))
        if time.monotonic() - sync.checked < self.sync_interval_s:
            return sync
        current = self.rows.version_of(collection)
        if current is None or current[0] != sync.state.vector_key:  # deleted, or deleted and made again
            with self._stores_lock:
                self._forget(sync)
            return self._open_store(self.rows.collection(collection))
        if current[1] != sync.seen and sync.lock.acquire(blocking=False):
            # A search never waits for another thread's catch-up: it searches what is there.
            try:
                sync.catch_up(current[1])
            finally:
                sync.lock.release()
        sync.checked = time.monotonic()
        return sync

    def _forget(self, sync: StoreSync) -> None:
        """Drop a store this process holds (call with `_stores_lock`)."""
        self._stores.pop(sync.state.id, None)
        if self._by_key.get(collection_key(sync.state.name)) is sync:
            self._by_key.pop(collection_key(sync.state.name))

    def _open_store(self, state: CollectionState) -> StoreSync:
        with self._stores_lock:
            sync = self._stores.get(state.id)
            if sync is None or sync.state.vector_key != state.vector_key:
                sync = self._new_store(state)
            return sync

    def rebuild(self, name: str, on_progress: Progress | None = None) -> int:
        """Drop the collection's engine data and fill it again from SQL (`cnclip reindex`)."""
        state = self.rows.collection(name)
        with self._stores_lock:
            if state.id in self._stores:
                self._forget(self._stores[state.id])
            self.vectors.drop(_spec(state))
            return self._new_store(state, on_progress, reason="on request").store.count()

    def _new_store(
        self, state: CollectionState, on_progress: Progress | None = None, reason: str | None = None
    ) -> StoreSync:
        """Open the engine's store of `state`, reconcile it with SQL and hold it (with `_stores_lock`)."""
        store = self.vectors.open(_spec(state), self.rows.vectors, lambda f: self.rows.filter_ids(state.id, f))
        sync = StoreSync(self.rows, store, state)
        with sync.lock:
            sync.reconcile(on_progress, reason)
            sync.checked = time.monotonic()
        self._stores[state.id] = sync
        self._by_key[collection_key(state.name)] = sync
        return sync

    def reconcile_all(self) -> None:
        """Open every collection's store and make it agree with SQL (one log line per repair)."""
        for state in self.rows.collections():
            self._open_store(state)

    def flush(self, names: Sequence[str] = ()) -> None:
        """Bring the stores of collections this process wrote (and of `names`) up to date and save
        them. A store that another process holds (a Milvus Lite file) is left to it: it catches up
        from SQL by itself."""
        for collection_id in sorted(self._written | {self.rows.collection(name).id for name in names}):
            state = self.rows.collection_by_id(collection_id)
            if state is None:
                continue
            try:
                sync = self._stores.get(collection_id) or self._open_store(state)
            except VectorStoreBusy as exc:
                log.warning("%s; it catches up from SQL within CNCLIP_SYNC_INTERVAL_S", exc.message)
                return
            with sync.lock:
                sync.catch_up(state.version)
            sync.store.save()

    def ping(self) -> None:
        """One cheap read of the database (readiness); `DatabaseUnavailable` when it does not answer."""
        self.rows.ping()

    def sweep_media(self) -> SweepResult:
        """Remove upload copies no row names and stale temp files (see indexer/media_sweep.py)."""
        return sweep_media(self.media_dir, self.rows.uploads_in_use)

    def close(self) -> None:
        """Save the stores and release the database."""
        if self._closed:
            return
        try:
            self.flush()
            for sync in list(self._stores.values()):
                sync.store.close()
        finally:
            self.vectors.close()
            self.engine.dispose()
            self._closed = True
