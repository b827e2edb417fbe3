"""The FAISS engine (the embedded default): one `VectorIndex` per collection in memory, saved to
`<data dir>/indexes/<database key>/<collection id>.faiss` (`<collection id>.g<N>.faiss` for model
generation N > 0, indexer/storage/sql/generations.py).

Every process holds its own copy in memory and catches it up from SQL (indexer/storage/sync.py), so the
file is only a head start for the next open: processes sharing a data dir save it under an
exclusive `flock` and load it under a shared one, and each save is atomic (temp file, fsync,
rename), so a reader sees a whole file, never a torn one. A file is adopted only when its header
names this collection's `vector_key` (indexer/storage/vectors/faiss/index.py); any other is rebuilt from SQL.
Filters become an id allow-list from SQL.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from indexer.config import StorageSettings
from indexer.domain.index_spec import parse_index
from indexer.domain.records import SearchFilters
from indexer.fs.disk_full import StorageFull
from indexer.storage.vectors.base import FetchVectors, FilterIds, ItemAttrs, SearchTuning, StoreSpec
from indexer.storage.vectors.faiss.index import IndexFileError, VectorIndex

log = logging.getLogger(__name__)


def has_filters(filters: SearchFilters | None) -> bool:
    return bool(filters and filters.any())


@contextmanager
def _file_lock(path: Path, exclusive: bool) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _present(index: VectorIndex, ids: np.ndarray) -> np.ndarray:
    """Mask of `ids` the index holds (tombstoned ids count as absent)."""
    if len(ids) == 0 or index.ntotal == 0:
        return np.zeros(len(ids), dtype=bool)
    return np.isin(ids, index.ids())


class FaissStore:
    """`VectorStore` over a `VectorIndex` and its file."""

    def __init__(
        self,
        spec: StoreSpec,
        index: VectorIndex,
        path: Path,
        fetch: FetchVectors,
        filter_ids: FilterIds,
        save_interval_s: float,
        problem: str | None = None,
    ) -> None:
        self.spec = spec
        self.index = index
        self.path = path
        self.fetch = fetch
        self.filter_ids = filter_ids
        self.save_interval_s = save_interval_s
        self.problem = problem  # why the saved file could not be used, if it could not
        self._changes = threading.Lock()
        self._dirty_since: float | None = time.monotonic() if problem else None

    def upsert(self, ids: np.ndarray, vectors: np.ndarray, attrs: Sequence[ItemAttrs]) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        with self._changes:
            new = ~_present(self.index, ids)
            if not new.any():
                return
            self.index.add(ids[new], np.asarray(vectors, dtype=np.float32)[new])
            self._train_if_due()
            self._touched()

    def remove(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        with self._changes:
            held = ids[_present(self.index, ids)]  # an HNSW tombstone for an absent id would skew counts
            if len(held):
                self.index.remove(held)
                self._touched()

    def _train_if_due(self) -> None:
        """Past the factory's training threshold, swap Flat for the trained index (built from SQL)."""
        if not self.index.wants_training(self.index.ntotal):
            return
        started = time.perf_counter()
        fresh = self.index.build(np.sort(self.index.ids()), self.fetch)
        if fresh.active == "Flat":  # FAISS could not train it (logged): the Flat index in use is as good
            return
        self.index.replace_with(fresh)
        log.info(
            "collection %s: trained %s on %d vectors in %.1f s",
            self.spec.name, self.spec.index, self.index.ntotal, time.perf_counter() - started,
        )  # fmt: skip

    def _touched(self) -> None:
        if self._dirty_since is None:
            self._dirty_since = time.monotonic()
        if time.monotonic() - self._dirty_since >= self.save_interval_s:
            self._save_locked()

    def search(self, query: np.ndarray, k: int, filters: SearchFilters | None = None) -> tuple[np.ndarray, np.ndarray]:
        allowed = self.filter_ids(filters) if filters is not None and has_filters(filters) else None
        if allowed is not None and len(allowed) == 0:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        return self.index.search(query, k, self.fetch, allowed)

    def count(self) -> int:
        return self.index.ntotal

    def ids(self) -> np.ndarray:
        return self.index.ids()

    def save(self) -> None:
        with self._changes:
            if self._dirty_since is not None:
                self._save_locked()

    def _save_locked(self) -> None:
        try:
            with _file_lock(self.path, exclusive=True):
                self.index.save(self.path)
        except (OSError, StorageFull) as exc:
            # Every change is committed in SQL and this copy is current; the file is only a head start
            # for the next open, which catches up from SQL. So a full disk fails no write: retry later.
            self._dirty_since = time.monotonic()
            log.warning("collection %s: index file not saved (retried later): %s", self.spec.name, exc)
            return
        self._dirty_since = None

    def close(self) -> None:
        self.save()


class FaissEngine:
    """`VectorEngine` keeping one FAISS file per collection under `index_dir`."""

    name = "faiss"

    def __init__(self, index_dir: Path, tuning: SearchTuning, save_interval_s: float) -> None:
        self.index_dir = index_dir
        self.tuning = tuning
        self.save_interval_s = save_interval_s
        self._remove_stale_temp_files()

    def check(self) -> None:
        """Nothing to check: the files are opened (and checked) one collection at a time."""

    def validate(self, index: str, dim: int) -> None:
        """`InvalidInput` unless `index` is in the grammar of indexer/domain/index_spec.py for `dim`-d
        vectors. Parsed, never tried: building a malformed factory string can kill the process
        inside FAISS (`PQ8x0` divides by zero), so no user text reaches `faiss.index_factory`."""
        parse_index(index, dim)

    def path(self, spec: StoreSpec) -> Path:
        # A file set per model generation: a swap (indexer/storage/sql/generations.py) never rewrites a file in use.
        suffix = f".g{spec.generation}" if spec.generation else ""
        return self.index_dir / f"{spec.collection_id}{suffix}.faiss"

    def open(self, spec: StoreSpec, fetch: FetchVectors, filter_ids: FilterIds) -> FaissStore:
        path = self.path(spec)
        problem = None
        try:
            with _file_lock(path, exclusive=False):
                index = VectorIndex.load(path, spec.dim, spec.index, spec.model, self.tuning, spec.vector_key)
        except IndexFileError as exc:
            index, problem = VectorIndex(spec.dim, spec.index, spec.model, self.tuning, spec.vector_key), str(exc)
        return FaissStore(spec, index, path, fetch, filter_ids, self.save_interval_s, problem)

    def drop(self, spec: StoreSpec) -> None:
        path = self.path(spec)
        with _file_lock(path, exclusive=True):
            path.unlink(missing_ok=True)
        path.with_name(path.name + ".lock").unlink(missing_ok=True)

    def close(self) -> None:
        pass

    def _remove_stale_temp_files(self) -> None:
        for tmp in self.index_dir.glob("*.tmp-*"):
            pid = tmp.name.split(".tmp-")[-1].split("-")[0]
            if pid.isdigit() and not _process_alive(int(pid)):
                tmp.unlink(missing_ok=True)


def open_engine(settings: StorageSettings, database_url: str) -> FaissEngine:
    """The registry's opener (indexer/storage/vectors/registry.py): files under the data dir, one folder per database
    (so two databases sharing a data dir never share index files)."""
    from indexer.storage.vectors.registry import search_tuning

    url_key = hashlib.sha1(database_url.encode()).hexdigest()[:10]
    return FaissEngine(settings.data_dir / "indexes" / url_key, search_tuning(settings), settings.index_save_interval_s)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
