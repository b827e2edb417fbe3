"""The catalog: SQL (indexer/storage/sql/rows.py) is the source of truth, a vector engine (FAISS or Milvus, chosen
from the registry in indexer/storage/vectors/registry.py, behind indexer/storage/vectors/base.py's protocols) the derived
search structure, kept equal to SQL by indexer/storage/sync.py. The collection service (indexer/service/collections.py)
is its one caller besides tests: the catalog stores what it is given, the service owns the rules.

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
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine

from indexer.domain.index_spec import parse_index
from indexer.domain.names import check_collection_name
from indexer.domain.records import (
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
from indexer.domain.values import naive_utc, text_sha
from indexer.domain.vectors import unit_vectors
from indexer.errors import GenerationMoved, VectorStoreBusy, VectorStoreError
from indexer.storage.catalog_duplicates import CatalogDuplicates
from indexer.storage.catalog_generations import CatalogGenerations
from indexer.storage.media.check import check_media, read_media
from indexer.storage.media.store import media_root
from indexer.storage.media.sweep import SweepResult, sweep_media
from indexer.storage.sql.deletion_rows import uploads_in_use_on
from indexer.storage.sql.move_rows import CatalogMoves
from indexer.storage.sql.rows import ItemRows
from indexer.storage.sql.taken import set_taken, sort_keys
from indexer.storage.store_health import is_collection_failure
from indexer.storage.store_pool import StorePool, store_spec
from indexer.storage.sync import Progress, StoreSync
from indexer.storage.texts import TextStore
from indexer.storage.vectors.base import VectorEngine
from retrieval.errors import InvalidInput, NotFound
from retrieval.preprocess import probe_image

__all__ = ["FileState", "SqlCatalog"]

log = logging.getLogger(__name__)


class SqlCatalog:
    """The ports of indexer/service/ports.py over SQLAlchemy (SQLite or PostgreSQL) and a `VectorEngine`:
    the core ones itself, the feature stores as `duplicates`, `generations`, `moves` and `texts`. It
    stores what it is given: the rules (which model, which kind, what a user's deletion means) are the
    collection service's (indexer/service/collections.py), the one caller besides tests."""

    def __init__(self, engine: Engine, data_dir: Path, vectors: VectorEngine, *, sync_interval_s: float = 0.5) -> None:
        self.engine = engine
        self.data_dir = Path(data_dir)
        self.media_dir = media_root(self.data_dir)
        self.rows = ItemRows(engine, self.media_dir)
        self.texts = TextStore(self.rows)  # text recognised in photos (issue 32)
        self.vectors = vectors
        self.stores = StorePool(self.rows, vectors, sync_interval_s)
        self._written: set[int] = set()  # collections this process wrote (flushed on close)
        self._closed = False
        # The feature stores the service's feature services take (indexer/service/ports.py).
        self.duplicates = CatalogDuplicates(self.rows)
        self.generations = CatalogGenerations(self.rows, self.stores, vectors)
        self.moves = CatalogMoves(self.rows, self._after_write)

    # --- collections (SQL) ---------------------------------------------------------------------
    def create_collection(
        self, name: str, kind: CollectionKind, model: str, dim: int, index: str = "Flat"
    ) -> CollectionInfo:
        """A new empty collection; `Conflict` if the name is taken (case-insensitively). The index
        description is parsed (indexer/domain/index_spec.py) and stored in its one spelling."""
        check_collection_name(name)
        if kind not in ("images", "texts"):
            raise InvalidInput("kind must be 'images' or 'texts'")
        if dim < 1 or not model:
            raise InvalidInput("a collection needs a model id and a positive dim")
        description = parse_index(index, dim).description  # before any engine sees the text
        self.vectors.validate(description, dim)  # the engine's own limits (Milvus: dimensions)
        state = self.rows.create_collection(name, kind, model, dim, description)
        return self._info(state, 0)

    def collection(self, name: str) -> CollectionState:
        """What SQL holds of the collection (`NotFound` otherwise); never opens a vector store."""
        return self.rows.collection(name)

    def collections(self) -> list[CollectionState]:
        """Every collection, oldest first, from SQL alone."""
        return self.rows.collections()

    def delete_collection(self, name: str) -> int:
        """Delete collection `name` with all its items and its vectors; returns how many items it held."""
        state = self.rows.collection(name)
        count = self.rows.item_counts(state.id).get(state.id, 0)
        self.generations.drop_stores(state)
        self.rows.drop_collection(state.id)
        self.stores.forget(state.id)
        self._written.discard(state.id)
        self.vectors.drop(store_spec(state))
        return count

    def get_collection(self, name: str) -> CollectionInfo:
        state = self.rows.collection(name)
        return self._info(state, self.rows.item_counts(state.id).get(state.id, 0))

    def list_collections(self) -> list[CollectionInfo]:
        counts = self.rows.item_counts()
        return [self._info(state, counts.get(state.id, 0)) for state in self.rows.collections()]

    def remembered_deletions(self, collection: str) -> set[str]:
        return self.rows.remembered_deletions(self.rows.collection(collection).id)

    def forget_deletions(self, collection: str) -> int:
        return self.rows.forget_deletions(self.rows.collection(collection).id)

    def remembered_count(self, collection: str) -> int:
        return self.rows.remembered_count(self.rows.collection(collection).id)

    def _info(self, state: CollectionState, items: int) -> CollectionInfo:
        """The collection with its counts: vectors as the store this process holds says (when it
        holds one), else the SQL count (what the store holds once caught up)."""
        held = self.stores.held(state.id)
        if held is not None and held.seen != state.version and held.state.vector_key == state.vector_key:
            self.stores.after_write(state.id, state.version)  # others' commits: count what SQL holds now
        sync = self.stores.held(state.id)
        degraded = self.stores.health.get(state.id) if sync is None else None
        return CollectionInfo(
            id=state.id,
            name=state.name,
            kind=state.kind,
            model=state.model,
            dim=state.dim,
            index=state.index,
            items=items,
            vectors=sync.store.count() if sync is not None else 0 if degraded is not None else items,
            created_at=state.created_at,
            degraded=degraded.summary if degraded is not None else None,
            ocr=state.ocr,
        )

    # --- writes ----------------------------------------------------------------------------------
    def add_images(
        self,
        collection: CollectionState | str,
        images: Sequence[NewImage],
        vectors: np.ndarray,
        *,
        replace: Sequence[int | None] | None = None,
        vector_key: str | None = None,
        bulk: bool = False,
    ) -> list[AddResult]:
        """Add images with their vectors; an image whose bytes the collection has already is not added
        again (`created=False`, the existing id). `replace[i]` names a row this image supersedes (a
        changed file), deleted in the same transaction. Each image comes with what its header says
        (mime, size, date): the service reads it once per image; a caller that did not (a test, a
        benchmark) gets it read here. `collection`: the state the service resolved or a name."""
        rows: list[dict[str, Any]] = []
        for image in images:
            sha = image.sha256 or hashlib.sha256(image.data).hexdigest()
            mime, width, height = image.mime, image.width, image.height
            if mime is None:
                mime, width, height = probe_image(image.data)
            fields: dict[str, Any] = {"path": image.path, "root": image.root, "sha256": sha}
            fields.update(mime=mime, width=width, height=height, caption=image.caption)
            fields.update(mtime=image.mtime, taken_source=image.taken_source)
            fields.update(taken_at=naive_utc(image.taken_at) if image.taken_at else None)
            fields.update(phash=image.phash, size=len(image.data) if image.size is None else image.size)
            rows.append({**fields, "tags": list(image.tags), "extra": dict(image.extra), "data": image.data})
        return self._add(collection, rows, vectors, replace, vector_key, bulk)

    def load_images(
        self, collection: CollectionState, images: Sequence[NewImage], vectors: np.ndarray, **kw: Any
    ) -> list[AddResult]:
        """`add_images` of a bulk load, the new rows by PostgreSQL COPY (indexer/storage/sql/bulk_load.py)."""
        return self.add_images(collection, images, vectors, bulk=True, **kw)

    def add_texts(
        self,
        collection: CollectionState | str,
        texts: Sequence[NewText],
        vectors: np.ndarray,
        *,
        vector_key: str | None = None,
    ) -> list[AddResult]:
        """Add texts with their vectors; a text the collection has already is not added again."""
        rows: list[dict[str, Any]] = []
        for text in texts:
            if not text.text.strip():
                raise InvalidInput("texts must not be empty")
            fields = {"sha256": text_sha(text.text), "caption": text.text}
            rows.append({**fields, "tags": list(text.tags), "extra": dict(text.extra)})
        return self._add(collection, rows, vectors, None, vector_key)

    def _add(
        self,
        collection: CollectionState | str,
        rows: list[dict[str, Any]],
        vectors: np.ndarray,
        replace: Sequence[int | None] | None,
        vector_key: str | None = None,
        bulk: bool = False,
    ) -> list[AddResult]:
        """`vector_key`: the model generation the vectors were made for (`GenerationMoved` when another
        is active now). The insert checks the key under the collection's lock with the key its version
        bump reads back (indexer/storage/sql/row_inserts.py), the one check that counts: a resolved
        `collection` is not read again before it."""
        state = collection if isinstance(collection, CollectionState) else self.rows.collection(collection)
        if vector_key is not None and vector_key != state.vector_key:
            raise GenerationMoved(f"collection {state.name!r} swapped its model generation; embed again")
        unit = unit_vectors(vectors, len(rows), state.dim)
        results, version = self.rows.add(state, rows, unit, replace, bulk)
        self._after_write(state.id, version)
        return results

    def update_files(self, collection: str, moves: Sequence[tuple[int, str, int, float]]) -> None:
        """Record (item id, new path, size, mtime) for files renamed or touched without new content."""
        self.rows.update_files(self.rows.collection(collection).id, moves)

    def set_taken(self, collection: str, updates: Sequence[tuple[int, datetime, TakenSource]]) -> None:
        """Record when photos already in the collection were taken (the backfill, indexer/storage/sql/taken.py)."""
        state = self.rows.collection(collection)
        self._after_write(state.id, set_taken(self.engine, state.id, updates))

    def delete(self, item_ids: Sequence[int], *, reason: str, remember: bool) -> int:
        """Delete items (any collections); returns how many existed. A `remember`ed deletion keeps
        `cnclip index` from adding the same bytes again. Upload copies go with their last row."""
        removed = self.rows.delete(item_ids, reason, remember)
        for collection_id in removed:
            self._after_write(collection_id, None)
        return sum(removed.values())

    def _after_write(self, collection_id: int, version: int | None) -> None:
        """After a commit: this process's store catches up. Never raises (the write stands and its
        answer says so): a failure is logged and the next search checks SQL's version again."""
        self._written.add(collection_id)
        try:
            self.stores.after_write(collection_id, version)
        except Exception as exc:
            log.warning(
                "collection %d: the write committed, but this process's vector store did not catch up (%s); "
                "the next search does",
                collection_id,
                " ".join(str(exc).split()) or type(exc).__name__,
            )
            held = self.stores.held(collection_id)
            if held is not None:
                held.checked = 0.0  # the next search asks SQL for the version and catches up

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

    def vectors_for(self, collection: str, ids: Sequence[int], vector_key: str) -> np.ndarray:
        """Stored vectors of `ids` of the collection's generation `vector_key` (active or previous)."""
        return self.generations.vectors_for(collection, ids, vector_key)

    def read_media(self, item: ItemRecord) -> bytes:
        """The item's image bytes, if they are still the indexed ones (`indexer.storage.media.check`: read once
        from a descriptor reached without leaving the indexed folder, sha256 checked); uploads are
        read from their copy under `data_dir/media`."""
        return read_media(item, self.media_dir)

    def check_media(self, item: ItemRecord) -> None:
        """The cheap check (`indexer.storage.media.check.check_media`): the file is there, inside its folder,
        of the recorded size."""
        check_media(item, self.media_dir)

    def file_states(self, collection: str) -> dict[str, FileState]:
        """Path -> state of every bulk-indexed file of the collection (for incremental runs)."""
        return self.rows.file_states(self.rows.collection(collection).id)

    def content_index(self, collection: str) -> dict[str, tuple[int, str | None]]:
        """sha256 -> (item id, path) of every item of the collection (dedupe and rename detection)."""
        return self.rows.content_index(self.rows.collection(collection).id)

    def sort_keys(self, item_ids: Sequence[int]) -> dict[int, tuple[datetime | None, datetime | None]]:
        """id -> (taken_at, created_at), naive UTC, for ordering search results by date."""
        return sort_keys(self.engine, item_ids)

    def index_ids(self, collection: str) -> np.ndarray:
        """The ids in the collection's vector store, sorted (tests compare them with SQL)."""
        return np.sort(self.stores.store(collection).store.ids())

    def sql_ids(self, collection: str) -> np.ndarray:
        return self.rows.ids(self.rows.collection(collection).id)

    # --- the vector engine ---------------------------------------------------------------------------
    def search(
        self,
        collection: str,
        vector: np.ndarray,
        k: int,
        filters: SearchFilters | None = None,
        *,
        vector_key: str | None = None,
    ) -> list[Hit]:
        """The `k` items most similar to `vector` (cosine), restricted by `filters`, best first. Opens
        the collection's store on first use. `vector_key`: the model generation the query was embedded
        for; `GenerationMoved` when the collection's active one is another (a swap meanwhile)."""
        if k < 1:
            raise InvalidInput("k must be at least 1")
        sync = self.stores.store(collection, vector_key)
        if vector_key is not None and sync.state.vector_key != vector_key:
            # The previous generation, answering while this process loads the new model; else GenerationMoved.
            sync = self.generations.older(sync.state, vector_key, sync.seen)
        query = unit_vectors(np.asarray(vector, dtype=np.float32).reshape(1, -1), 1, sync.state.dim)[0]
        try:
            ids, scores = sync.store.search(query, k, filters)
        except Exception as exc:  # one collection's engine failing degrades that collection only
            if not is_collection_failure(exc):
                raise
            raise self.stores.failed(sync, "search", exc) from exc
        return [Hit(int(i), float(s)) for i, s in zip(ids, scores, strict=True)]

    def store(self, collection: str) -> StoreSync:
        """The collection's open store (opened and reconciled on first use; tests look inside it)."""
        return self.stores.store(collection)

    def vector_count(self, collection: str) -> int:
        """How many vectors the engine holds for the collection, once its store is open (and so
        reconciled with SQL); raises the engine's error when it cannot be opened."""
        return self.stores.store(collection).store.count()

    def rebuild(self, name: str, on_progress: Progress | None = None) -> int:
        """Drop the collection's engine data and fill it again from SQL (`cnclip reindex`)."""
        return self.stores.rebuild(self.rows.collection(name), on_progress)

    def reconcile_all(self) -> None:
        """Open every collection's store and make it agree with SQL (one log line per repair). One
        that cannot be opened is degraded (logged; it answers 503), never a reason not to start."""
        for state in self.rows.collections():
            try:
                self.stores.open(state)
            except VectorStoreBusy:
                raise
            except VectorStoreError:
                continue

    def flush(self, names: Sequence[str] = ()) -> None:
        """Bring the stores of collections this process wrote (and of `names`) up to date and save
        them. A store that another process holds (a Milvus Lite file) is left to it: it catches up
        from SQL by itself."""
        ids = self._written | {self.rows.collection(name).id for name in names}
        self.stores.flush(ids)
        self._written -= ids

    def ping(self) -> None:
        """One cheap read of the database (readiness); `DatabaseUnavailable` when it does not answer."""
        self.rows.ping()

    def sweep_media(self) -> SweepResult:
        """Remove upload copies no row names and stale temp files (see indexer/storage/media/sweep.py)."""
        # Its connection first, the media lock then (indexer/storage/sql/lock_order.py): never the pool under the lock.
        with self.engine.connect() as connection:
            return sweep_media(self.media_dir, lambda shas: uploads_in_use_on(connection, shas))

    def close(self) -> None:
        """Save the stores and release the database."""
        if self._closed:
            return
        try:
            self.flush()
            self.stores.close()
        finally:
            self.vectors.close()
            self.engine.dispose()
            self._closed = True
