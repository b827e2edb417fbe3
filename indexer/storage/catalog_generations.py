"""The catalog's model generations (SQL: indexer/storage/sql/generations.py): a shadow generation filled with the
next model, the atomic swap, rollback and dropping, and each generation's own vector store: the
`GenerationStore` port (indexer/service/ports.py), held by `SqlCatalog` as `generations`; the collection
service (indexer/service/migration_cases.py) owns the rules and the job."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from indexer.domain.generations import PREVIOUS, SHADOW, Generation, MigrationStatus
from indexer.domain.index_spec import parse_index
from indexer.domain.records import CollectionState
from indexer.domain.vectors import unit_vectors
from indexer.errors import CollectionUnavailable, GenerationMoved, VectorStoreError
from indexer.storage.sql.generations import GenerationRows
from indexer.storage.sql.model_sources import model_source, previous_generation, record_model_source
from indexer.storage.sql.rows import ItemRows
from indexer.storage.store_health import is_collection_failure
from indexer.storage.store_pool import StorePool
from indexer.storage.sync import StoreSync
from indexer.storage.vectors.base import StoreSpec, VectorEngine
from retrieval.errors import InvalidInput

log = logging.getLogger(__name__)


def generation_spec(state: CollectionState, generation: Generation) -> StoreSpec:
    """The engine's view of one generation of a collection: its own file set (FAISS) or collection (Milvus)."""
    return StoreSpec(
        state.id, state.name, generation.dim, state.index, generation.model, generation.vector_key, generation.number
    )


class _GenerationItemRows(ItemRows):
    """`ItemRows` seen through one generation: its covered ids and its vectors (a store built ahead of a swap)."""

    def __init__(self, rows: ItemRows, generations: GenerationRows, generation: Generation) -> None:
        super().__init__(rows.engine, rows.media_dir)
        self.generations = generations
        self.generation = generation

    def ids(self, collection_id: int) -> np.ndarray:
        assert self.generation.id is not None
        return self.generations.covered_ids(self.generation.id)

    def vectors(self, ids: np.ndarray | Sequence[int]) -> np.ndarray:
        assert self.generation.id is not None
        return self.generations.vectors(self.generation.id, ids, self.generation.dim)


class CatalogGenerations:
    """Held by `SqlCatalog` (indexer/storage/catalog.py) as `generations`, over its rows, stores and engine."""

    def __init__(self, rows: ItemRows, stores: StorePool, vectors: VectorEngine) -> None:
        self.rows = rows
        self.stores = stores
        self.vectors = vectors
        self.sql = GenerationRows(rows.engine)
        # vector_key -> the store of a collection's previous generation, searched while this process
        # loads the model the collection swapped to (indexer/service/model_loader.py); released once it has it.
        self._older: dict[str, StoreSync] = {}
        self._older_lock = threading.Lock()

    def record_model_source(self, model: str, directory: str) -> None:
        """Remember the directory `model` is loaded from (`cnclip migrate --model DIR`)."""
        record_model_source(self.rows.engine, model, directory)

    def model_source(self, model: str) -> str | None:
        return model_source(self.rows.engine, model)

    def vectors_for(self, collection: str, ids: Sequence[int], vector_key: str) -> np.ndarray:
        """Stored vectors of `ids` (in that order; a zero row for an id without one) of the collection's
        generation `vector_key`: the active one, or the previous one that answers while this process loads
        the model of a swap. `GenerationMoved` when it is neither, or a swap falls between the reads
        (a query that excludes re-scores its candidates with them: indexer/domain/exclusion.py)."""
        state = self.rows.collection(collection)
        if state.vector_key == vector_key:
            vectors = self.rows.vectors(ids)
        else:
            previous = self.previous(state)
            if previous is None or previous.vector_key != vector_key:
                raise GenerationMoved(f"collection {collection!r} no longer holds that model generation")
            vectors = self.vectors_of(previous, ids)
        if self.rows.collection(collection).vector_key != state.vector_key:
            raise GenerationMoved(f"collection {collection!r} swapped its model generation; search again")
        return vectors

    def previous(self, state: CollectionState) -> Generation | None:
        """The collection's previous generation (one cheap read: its `vectors` is not counted)."""
        return previous_generation(self.rows.engine, state.id)

    def older(self, state: CollectionState, vector_key: str, version: int) -> StoreSync:
        """The store of the collection's previous generation, if `vector_key` names it (opened from SQL
        on first use, caught up with the collection's version after); `GenerationMoved` otherwise (it
        was dropped or swapped back meanwhile)."""
        previous = self.previous(state)
        if previous is None or previous.vector_key != vector_key:
            raise GenerationMoved(f"collection {state.name!r} no longer holds that model generation")
        with self._older_lock:
            sync = self._older.get(vector_key)
            if sync is None:
                rows = _GenerationItemRows(self.rows, self.sql, previous)
                older = replace(state, model=previous.model, dim=previous.dim, vector_key=previous.vector_key,
                                generation=previous.number)  # fmt: skip
                try:
                    store = self.vectors.open(
                        generation_spec(state, previous), rows.vectors, lambda f: self.rows.filter_ids(state.id, f)
                    )
                    sync = StoreSync(rows, store, older)
                    with sync.lock:
                        sync.reconcile()
                except Exception as exc:
                    if not is_collection_failure(exc):
                        raise
                    log.error("collection %s: its previous generation's store failed to open: %r", state.name, exc)
                    raise CollectionUnavailable(
                        f"collection {state.name!r} is between two models and its previous one cannot be searched; "
                        "retry in a moment"
                    ) from exc
                self._older[vector_key] = sync
        if version > sync.seen and sync.lock.acquire(blocking=False):
            try:
                sync.catch_up(version)
            finally:
                sync.lock.release()
        return sync

    def release_older(self) -> None:
        """Forget the previous generations' stores (this process now holds every model it answers);
        their files are not saved again, so a generation dropped meanwhile leaves nothing behind."""
        with self._older_lock:
            self._older.clear()

    def status(self, name: str) -> MigrationStatus:
        return self.sql.status(self.rows.collection(name))

    def shadows(self) -> dict[int, tuple[str, int]]:
        """collection id -> (the model it migrates to, items its shadow covers), for collections migrating now."""
        return self.sql.shadows()

    def begin_shadow(self, name: str, model: str, dim: int) -> Generation:
        """The collection's shadow generation for `model` (resumed, reused from the previous one, or new).
        The collection's index description must hold for `dim`-d vectors in this engine."""
        return self.sql.begin_shadow(self.check_shadow(name, model, dim), model, dim)

    def check_shadow(self, name: str, model: str, dim: int) -> CollectionState:
        """The collection, if a shadow generation of `model` (`dim`-d) can be made: its index description
        holds for `dim`-d vectors in this engine (`InvalidInput` otherwise)."""
        state = self.rows.collection(name)
        if dim < 1 or not model:
            raise InvalidInput("a generation needs a model id and a positive dim")
        try:
            self.vectors.validate(parse_index(state.index, dim).description, dim)
        except InvalidInput as exc:
            raise InvalidInput(
                f"collection {state.name!r} uses index {state.index!r}, which {dim}-d vectors of {model} cannot "
                f"use: {exc.message}"
            ) from exc
        return state

    def shadow_missing(self, name: str, generation: Generation, limit: int, after: int = 0) -> list[int]:
        """Up to `limit` item ids above `after` of the collection the generation has no vector for yet."""
        assert generation.id is not None
        return self.sql.missing_ids(self.rows.collection(name).id, generation.id, limit, after)

    def put_shadow(self, generation: Generation, ids: Sequence[int], vectors: np.ndarray) -> int:
        """Store a generation's vectors (checked, indexer/domain/vectors.py); returns how many were new."""
        return self.sql.put_vectors(generation, ids, unit_vectors(vectors, len(ids), generation.dim))

    def covered_ids(self, generation: Generation) -> np.ndarray:
        """The ids the generation has a vector for, sorted."""
        assert generation.id is not None
        return self.sql.covered_ids(generation.id)

    def vectors_of(self, generation: Generation, ids: Sequence[int]) -> np.ndarray:
        """The generation's stored vectors of `ids`, in that order."""
        assert generation.id is not None
        return self.sql.vectors(generation.id, ids, generation.dim)

    def prepare(self, name: str, generation: Generation) -> bool:
        """Build and save the generation's vector store from SQL ahead of its swap, so that every process
        opens it ready instead of filling it from SQL on its first search. False (nothing built) when
        the engine's storage is held by another process (a Milvus Lite file): that process builds it."""
        state = self.rows.collection(name)
        rows = _GenerationItemRows(self.rows, self.sql, generation)
        try:
            store = self.vectors.open(
                generation_spec(state, generation), rows.vectors, lambda f: self.rows.filter_ids(state.id, f)
            )
        except VectorStoreError as exc:
            log.warning("the %s generation's store is built by the process that holds it: %s", name, exc.message)
            return False
        try:
            sync = StoreSync(rows, store, state)
            with sync.lock:
                sync.reconcile(reason=None)
            store.save()
        finally:
            store.close()
        return True

    def swap(self, name: str, role: str) -> CollectionState:
        """Make the shadow (or, for a rollback, the previous) generation active in one transaction; every
        process sees it with the collection's next version. Drops the engine data of a generation the
        swap forgot (an older previous)."""
        state = self.rows.collection(name)
        fresh, dropped = self.sql.swap(state, role if role in (SHADOW, PREVIOUS) else SHADOW)
        self.stores.forget(state.id)  # this process opens the new generation's store on its next search
        if dropped is not None:
            self._drop_store(fresh, dropped)
        log.info(
            "collection %s: generation %d (%s, %d-d) is active", fresh.name, fresh.generation, fresh.model, fresh.dim
        )
        return fresh

    def drop(self, name: str, role: str) -> Generation:
        state = self.rows.collection(name)
        dropped = self.sql.drop(state, role)
        self._drop_store(state, dropped)
        return dropped

    def drop_stores(self, state: CollectionState) -> None:
        """The engine data of every non-active generation (the collection is being deleted)."""
        for generation in self.sql.all_generations(state.id):
            self._drop_store(state, generation)

    def _drop_store(self, state: CollectionState, generation: Generation) -> None:
        try:
            self.vectors.drop(generation_spec(state, generation))
        except VectorStoreError as exc:  # SQL forgot it already; the engine's leftover is unreachable
            log.warning(
                "could not drop generation %d of %s from the engine: %s", generation.number, state.name, exc.message
            )
