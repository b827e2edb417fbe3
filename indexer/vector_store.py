"""The vector engine behind one protocol: FAISS files (embedded default) or Milvus (scale-out).

A `VectorEngine` is opened once per catalog; it hands out one `VectorStore` per collection. A store
is derived data: ids are SQL item ids, vectors are the L2-normalised copies stored in SQL, and
indexer/sync.py can always rebuild it or catch it up from SQL. Vectors never change for an id (a
changed file gets a new id), so `upsert` of an id the store holds already is a no-op, and removing
an id it does not hold is one too: applying the same change twice is harmless.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

import numpy as np

from indexer.types import SearchFilters
from retrieval.errors import CnclipError

EngineName = Literal["faiss", "milvus"]
FetchVectors = Callable[[np.ndarray], np.ndarray]  # ids -> (len(ids), dim) float32, same order
FilterIds = Callable[[SearchFilters], np.ndarray]  # filters -> the ids that pass them (from SQL)


class VectorStoreBusy(CnclipError):
    """The engine's storage is held by another process that cannot share it (a Milvus Lite file
    takes one process); the message names that process."""

    code = "vector_store_busy"


class VectorStoreUnavailable(CnclipError):
    """The engine cannot be reached or opened (a Milvus server down, a damaged Milvus Lite file)."""

    code = "vector_store_unavailable"


class VectorStoreIncompatible(CnclipError):
    """The engine refuses what we ask for good (a Milvus older than the minimum, a request its version
    cannot parse): retrying cannot help, so it is not `VectorStoreUnavailable`'s "retry in a moment"."""

    code = "vector_store_incompatible"


@dataclass(frozen=True)
class ItemAttrs:
    """The fields search filters look at, for engines that filter inside the engine (Milvus)."""

    mime: str | None
    tags: tuple[str, ...]
    created_at: datetime  # naive UTC, like SQL
    taken_at: datetime | None = None  # naive UTC; None: unknown (never passes a taken_from/taken_to filter)


@dataclass(frozen=True)
class StoreSpec:
    """What an engine needs to know of a collection to hold its vectors."""

    collection_id: int
    name: str
    dim: int
    factory: str  # index description, e.g. Flat, HNSW32, IVF1024,Flat, IVF1024,PQ64
    model: str
    vector_key: str  # names the collection inside a shared engine (Milvus), never reused


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
    def name(self) -> EngineName: ...

    def check(self) -> None:
        """Raise now what would stop this engine later: `VectorStoreIncompatible` for a server this
        code cannot use (too old), `VectorStoreUnavailable` for one it cannot reach."""

    def validate(self, factory: str, dim: int) -> None:
        """`InvalidInput` when this engine cannot build `factory` for `dim`-d vectors."""

    def open(self, spec: StoreSpec, fetch: FetchVectors, filter_ids: FilterIds) -> VectorStore:
        """The collection's store as saved (possibly stale or empty: sync.py reconciles it)."""

    def drop(self, spec: StoreSpec) -> None:
        """Forget the collection's vectors (its SQL rows are gone)."""

    def close(self) -> None: ...
