"""The catalog's model generations (SQL: indexer/generations.py): a shadow generation filled with the
next model, the atomic swap, rollback and dropping, and each generation's own vector store. Mixed into
`SqlCatalog`; the collection service (indexer/migration_cases.py) owns the rules and the job."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from indexer.errors import VectorStoreError
from indexer.generations import PREVIOUS, SHADOW, Generation, GenerationRows, MigrationStatus
from indexer.index_spec import parse_index
from indexer.rows import ItemRows
from indexer.store_pool import StorePool
from indexer.sync import StoreSync
from indexer.types import CollectionState
from indexer.vector_store import StoreSpec, VectorEngine
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
    """Mixed into `SqlCatalog` (indexer/catalog.py)."""

    rows: ItemRows
    stores: StorePool
    vectors: VectorEngine

    @property
    def generations(self) -> GenerationRows:
        return GenerationRows(self.rows.engine)

    def generation_status(self, name: str) -> MigrationStatus:
        return self.generations.status(self.rows.collection(name))

    def migrations(self) -> dict[int, tuple[str, int]]:
        """collection id -> (the model it migrates to, items its shadow covers), for collections migrating now."""
        return self.generations.shadows()

    def begin_shadow(self, name: str, model: str, dim: int) -> Generation:
        """The collection's shadow generation for `model` (resumed, reused from the previous one, or new).
        The collection's index description must hold for `dim`-d vectors in this engine."""
        return self.generations.begin_shadow(self.check_shadow(name, model, dim), model, dim)

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
        return self.generations.missing_ids(self.rows.collection(name).id, generation.id, limit, after)

    def put_shadow(self, generation: Generation, ids: Sequence[int], vectors: np.ndarray) -> int:
        """Store a generation's vectors (normalised here); returns how many were new."""
        from indexer.catalog import unit_vectors

        return self.generations.put_vectors(generation, ids, unit_vectors(vectors, len(ids), generation.dim))

    def generation_ids(self, generation: Generation) -> np.ndarray:
        """The ids the generation has a vector for, sorted."""
        assert generation.id is not None
        return self.generations.covered_ids(generation.id)

    def generation_vectors(self, generation: Generation, ids: Sequence[int]) -> np.ndarray:
        assert generation.id is not None
        return self.generations.vectors(generation.id, ids, generation.dim)

    def prepare_generation(self, name: str, generation: Generation) -> bool:
        """Build and save the generation's vector store from SQL ahead of its swap, so that every process
        opens it ready instead of filling it from SQL on its first search. False (nothing built) when
        the engine's storage is held by another process (a Milvus Lite file): that process builds it."""
        state = self.rows.collection(name)
        rows = _GenerationItemRows(self.rows, self.generations, generation)
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

    def swap_generation(self, name: str, role: str) -> CollectionState:
        """Make the shadow (or, for a rollback, the previous) generation active in one transaction; every
        process sees it with the collection's next version. Drops the engine data of a generation the
        swap forgot (an older previous)."""
        state = self.rows.collection(name)
        fresh, dropped = self.generations.swap(state, role if role in (SHADOW, PREVIOUS) else SHADOW)
        self.stores.forget(state.id)  # this process opens the new generation's store on its next search
        if dropped is not None:
            self._drop_store(fresh, dropped)
        log.info(
            "collection %s: generation %d (%s, %d-d) is active", fresh.name, fresh.generation, fresh.model, fresh.dim
        )
        return fresh

    def drop_generation(self, name: str, role: str) -> Generation:
        state = self.rows.collection(name)
        dropped = self.generations.drop(state, role)
        self._drop_store(state, dropped)
        return dropped

    def drop_generation_stores(self, state: CollectionState) -> None:
        """The engine data of every non-active generation (the collection is being deleted)."""
        for generation in self.generations.all_generations(state.id):
            self._drop_store(state, generation)

    def _drop_store(self, state: CollectionState, generation: Generation) -> None:
        try:
            self.vectors.drop(generation_spec(state, generation))
        except VectorStoreError as exc:  # SQL forgot it already; the engine's leftover is unreachable
            log.warning(
                "could not drop generation %d of %s from the engine: %s", generation.number, state.name, exc.message
            )
