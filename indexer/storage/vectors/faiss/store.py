"""The FAISS engine (the embedded default): one `VectorIndex` per collection in memory, saved to
`<data dir>/indexes/<database key>/<collection id>.faiss` (`<collection id>.g<N>.faiss` for model
generation N > 0, indexer/storage/sql/generations.py).

Every process holds its own copy in memory and catches it up from SQL (indexer/storage/sync.py), so the
file is only a head start for the next open: processes sharing a data dir save it under an
exclusive `flock` and load it under a shared one, and each save is atomic (temp file, fsync,
rename), so a reader sees a whole file, never a torn one, or appends to the file's log
(`<collection id>.faiss.delta`, indexer/storage/vectors/faiss/saving.py: fsynced records a reader
replays up to the first torn one). A file is adopted only when its header
names this collection's `vector_key` (indexer/storage/vectors/faiss/index.py); any other is rebuilt from SQL.
Filters become an id allow-list from SQL.

Training (Flat → the configured index, or `Auto`'s next IVF) runs in one background thread per store:
it builds the new index from a snapshot of the ids, outside every lock, while searches and writes go
on against the index in use; then, under the writers' lock, it applies what was added or removed
meanwhile and swaps the new index in (`VectorIndex.replace_with`: searches see the old index or the
new one, never none). A failed build leaves the index in use (logged; tried again at twice the
count). `close` waits for a running build (its work lands in the file); `drop` and the engine's
`close` cancel it between steps and wait for the thread, so no thread outlives its store.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from indexer.config import StorageSettings
from indexer.domain.index_spec import parse_index
from indexer.domain.records import SearchFilters
from indexer.fs.disk_full import StorageFull
from indexer.storage.vectors.base import FetchVectors, FilterIds, ItemAttrs, SearchTuning, StoreSpec
from indexer.storage.vectors.faiss.delta import delta_path
from indexer.storage.vectors.faiss.index import IndexFileError, TrainingCancelled, VectorIndex

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
        self._trainer: threading.Thread | None = None  # the background build, while one runs
        self._no_more_training = False  # closing: no build starts
        self._cancel_training = threading.Event()  # dropping: a running build stops between steps

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
        """(With `_changes` held.) Past the index's next size (the factory's training threshold;
        Auto: its IVF size, then every 4×), start building the new index in the background from a
        snapshot of the ids, unless a build runs already or the store is closing."""
        if self._trainer is not None or self._no_more_training or self._cancel_training.is_set():
            return
        if not self.index.wants_training(self.index.ntotal):
            return
        snapshot = np.sort(self.index.ids())
        self._trainer = threading.Thread(
            target=self._train, args=(snapshot,), name=f"cnclip-train-{self.spec.collection_id}", daemon=True
        )
        self._trainer.start()

    def _train(self, snapshot: np.ndarray) -> None:
        """The background build: the new index from SQL's vectors of `snapshot`, outside every lock;
        then, with `_changes`, catch it up and swap it in."""
        started = time.perf_counter()
        try:
            fresh = self.index.build(snapshot, self.fetch, cancelled=self._cancel_training)
            with self._changes:
                if self._cancel_training.is_set():
                    raise TrainingCancelled("its collection is being dropped")
                if fresh.active == "Flat":  # FAISS could not train it (logged): keep the index in use
                    return
                added, removed = self._catch_up(fresh, snapshot)
                self.index.replace_with(fresh)
                self._touched()
            log.info(
                "collection %s: trained %s on %d vectors in %.1f s (%d added, %d removed meanwhile)",
                self.spec.name, fresh.active, len(snapshot), time.perf_counter() - started, added, removed,
            )  # fmt: skip
        except TrainingCancelled as exc:
            log.info("collection %s: training stopped: %s", self.spec.name, exc)
        except Exception:
            # A background thread has no caller to raise to (an SQL outage while fetching, say): the
            # index in use stays, and the next try waits for twice as many vectors, as for FAISS's refusal.
            self.index.training_failed_at = len(snapshot)
            log.exception(
                "collection %s: training on %d vectors failed; searching the index in use (%s) until %d",
                self.spec.name, len(snapshot), self.index.active, 2 * len(snapshot),
            )  # fmt: skip
        finally:
            with self._changes:
                self._trainer = None

    def _catch_up(self, fresh: VectorIndex, snapshot: np.ndarray) -> tuple[int, int]:
        """(With `_changes` held.) Apply to `fresh` what the index in use gained and lost since
        `snapshot`; returns (added, removed)."""
        held = np.sort(self.index.ids())
        added = np.setdiff1d(held, snapshot, assume_unique=True)
        removed = np.setdiff1d(snapshot, held, assume_unique=True)
        fresh.remove(removed)
        for start in range(0, len(added), 20_000):
            part = added[start : start + 20_000]
            fresh.add(part, self.fetch(part))
        return len(added), len(removed)

    @property
    def training(self) -> bool:
        """Whether a background build is running."""
        return self._trainer is not None

    def wait_for_training(self, timeout: float | None = None) -> bool:
        """Wait for a running background build to be swapped in (or to fail); False on timeout."""
        trainer = self._trainer
        if trainer is not None:
            trainer.join(timeout)
            return not trainer.is_alive()
        return True

    def stop_training(self) -> None:
        """Cancel a running build (it stops between steps: one FAISS k-means runs to its end) and
        wait for its thread; no build starts after this (the collection is being dropped)."""
        self._cancel_training.set()
        self.wait_for_training()

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
        """Wait for a running build (so the file saved holds it), then save."""
        self._no_more_training = True
        if self._trainer is not None:
            log.info("collection %s: waiting for its index being trained, then saving", self.spec.name)
        self.wait_for_training()
        self.save()


class FaissEngine:
    """`VectorEngine` keeping one FAISS file per collection under `index_dir`."""

    name = "faiss"

    def __init__(self, index_dir: Path, tuning: SearchTuning, save_interval_s: float) -> None:
        self.index_dir = index_dir
        self.tuning = tuning
        self.save_interval_s = save_interval_s
        # The stores handed out (weakly: a forgotten one goes): `drop` and `close` stop their builds.
        self._stores: weakref.WeakSet[FaissStore] = weakref.WeakSet()
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
        store = FaissStore(spec, index, path, fetch, filter_ids, self.save_interval_s, problem)
        self._stores.add(store)
        return store

    def drop(self, spec: StoreSpec) -> None:
        path = self.path(spec)
        for store in list(self._stores):
            if store.path == path:
                store.stop_training()  # a build of the dropped collection's vectors is no use
        with _file_lock(path, exclusive=True):
            path.unlink(missing_ok=True)
            delta_path(path).unlink(missing_ok=True)
        path.with_name(path.name + ".lock").unlink(missing_ok=True)

    def close(self) -> None:
        """Stop the builds of stores not closed (forgotten after a failure): no thread outlives the engine."""
        for store in list(self._stores):
            store.stop_training()

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
