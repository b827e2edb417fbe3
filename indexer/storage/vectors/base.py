"""The vector engine behind one protocol, and what every engine shares: the search tuning, the id
checksum reconciling uses, the records a store is opened with. Engine-neutral: nothing here knows
FAISS or Milvus; the engines (indexer/storage/vectors/faiss/store.py, indexer/storage/vectors/milvus/store.py) are chosen from the
registry in indexer/storage/vectors/registry.py.

A `VectorEngine` is opened once per catalog; it hands out one `VectorStore` per collection. A store
is derived data: ids are SQL item ids, vectors are the L2-normalised copies stored in SQL, and
indexer/storage/sync.py can always rebuild it or catch it up from SQL. Vectors never change for an id (a
changed file gets a new id), so `upsert` of an id the store holds already is a no-op, and removing
an id it does not hold is one too: applying the same change twice is harmless.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from indexer.domain.records import ItemAttrs, SearchFilters
from indexer.errors import VectorStoreBusy, VectorStoreIncompatible, VectorStoreUnavailable

__all__ = [
    "FetchVectors",
    "FilterIds",
    "ItemAttrs",
    "SearchTuning",
    "StoreSpec",
    "VectorEngine",
    "VectorStore",
    "VectorStoreBusy",
    "VectorStoreIncompatible",
    "VectorStoreUnavailable",
    "id_checksum",
]

FetchVectors = Callable[[np.ndarray], np.ndarray]  # ids -> (len(ids), dim) float32, same order
FilterIds = Callable[[SearchFilters], np.ndarray]  # filters -> the ids that pass them (from SQL)


@dataclass(frozen=True)
class SearchTuning:
    """How hard searches look, for every engine (settings `CNCLIP_SEARCH_RERANK_FACTOR`, `CNCLIP_INDEX_*`)."""

    rerank_factor: int = 4  # approximate indexes fetch k*rerank_factor candidates, then re-rank exactly
    nprobe: int = 32  # IVF lists visited per query
    ef_search: int = 128  # HNSW candidate list size
    train_min: int = 10_000  # vectors needed before a non-flat index is trained and used (FAISS)
    auto_ivf_min: int = 20_000  # `Auto` collections stay Flat below this many vectors (FAISS)
    exact_filter_max: int = 4096  # filters matching at most this many items are searched exactly


def id_checksum(ids: np.ndarray) -> int:
    """Order-independent checksum of a set of ids (reconcile compares count, max id and this)."""
    mixed = (np.asarray(ids, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(0xBF58476D1CE4E5B9)
    return int(np.bitwise_xor.reduce(mixed)) if len(mixed) else 0


@dataclass(frozen=True)
class StoreSpec:
    """What an engine needs to know of a collection to hold its vectors."""

    collection_id: int
    name: str
    dim: int
    index: str  # index description (indexer/domain/index_spec.py), e.g. Flat, HNSW32, IVF1024,Flat, IVF1024,PQ64
    model: str
    vector_key: str  # names the collection inside a shared engine (Milvus), never reused
    generation: int = 0  # the model generation (indexer/storage/sql/generations.py): each has its own files


class VectorStore(Protocol):
    """One collection's search structure. Thread-safe: searches run while changes are applied."""

    def upsert(self, ids: np.ndarray, vectors: np.ndarray, attrs: Sequence[ItemAttrs]) -> None:
        """Add these vectors; ids already held are left as they are."""

    def remove(self, ids: np.ndarray) -> None:
        """Remove these ids; ids not held are ignored."""

    def search(self, query: np.ndarray, k: int, filters: SearchFilters | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top `k` (ids, cosine scores) for one L2-normalised query, among the items passing `filters`
        (never fewer than k when at least k items pass)."""

    def count(self) -> int: ...

    def ids(self) -> np.ndarray:
        """Every id held (any order)."""

    def save(self) -> None:
        """Make what it holds durable where the engine keeps local files (FAISS); else nothing."""

    def close(self) -> None: ...


class VectorEngine(Protocol):
    @property
    def name(self) -> str:
        """Its name in the registry (indexer/storage/vectors/registry.py), as `CNCLIP_VECTOR_STORE` says it."""

    def check(self) -> None:
        """Raise now what would stop this engine later: `VectorStoreIncompatible` for a server this
        code cannot use (too old), `VectorStoreUnavailable` for one it cannot reach."""

    def validate(self, index: str, dim: int) -> None:
        """`InvalidInput` when this engine cannot build the index described by `index` for `dim`-d vectors."""

    def open(self, spec: StoreSpec, fetch: FetchVectors, filter_ids: FilterIds) -> VectorStore:
        """The collection's store as saved (possibly stale or empty: sync.py reconciles it)."""

    def drop(self, spec: StoreSpec) -> None:
        """Forget the collection's vectors (its SQL rows are gone)."""

    def close(self) -> None: ...
