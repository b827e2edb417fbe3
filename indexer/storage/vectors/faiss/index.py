"""One FAISS index per collection: ID-mapped (ids = SQL primary keys), inner product, derived data.

`Flat` until the collection is large enough to train its configured index (IVF, HNSW, PQ: what
"large enough" is comes from the parsed spec, `IndexSpec.training_points`), and `Flat` still, searched
exactly, when FAISS refuses to train it (tried again at twice the count); approximate indexes fetch k·r candidates and re-rank them exactly with the stored vectors.
`Auto` (the default for new collections) is Flat up to `SearchTuning.auto_ivf_min` vectors, then
`IVF{≈4√n},Flat`, trained again whenever the collection has grown 4× (indexer/domain/index_spec.py
`auto_target`); `active` names what it is now. Building the trained index is slow: the store does it
in a background thread and swaps it in with `replace_with` (indexer/storage/vectors/faiss/store.py).
Only a Flat body removes vectors in place; IVF and HNSW hide removed ids (`tombstones`) until rebuilt
(Auto rebuilds once they pass a quarter of the collection). The
configured description is parsed (indexer/domain/index_spec.py); FAISS's factory only ever sees the
string re-rendered from the parsed record, never the stored text itself.
A file (the base) is written whole and atomically (temp file, fsync, rename) with a checksum, so a
reader sees the old index or the new one, and a damaged file is detected and rebuilt from SQL. Saves
in between append only what changed to the base's log (delta.py), so adding 200 photos to a 1M
collection writes 200 vectors, not 2 GB; when the base is rewritten instead is saving.py's rule
(`needs_full_save` after a rebuilt index is swapped in). Loading replays the log onto the base. The header
names the collection the file belongs to (`owner`: its never-reused `vector_key`, a random uuid): a
valid file of another collection or another catalog (same dim, factory and model, even the same ids)
copied into place is rebuilt from SQL, never adopted with another catalog's vectors.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from indexer.domain.index_spec import (
    FLAT,
    IndexSpec,
    InvalidIndexDescription,
    auto_lists,
    auto_target,
    parse_index,
)
from indexer.storage.vectors.base import FetchVectors, SearchTuning
from indexer.storage.vectors.faiss.auto import RecallProbe, as_flat
from indexer.storage.vectors.faiss.delta import Change
from indexer.storage.vectors.faiss.file import IndexFileError, read_index_file
from indexer.storage.vectors.faiss.rwlock import ReadWriteLock
from indexer.storage.vectors.faiss.saving import IndexFiles, file_identity

log = logging.getLogger(__name__)


class TrainingCancelled(Exception):
    """A build stopped because its collection is being dropped or closed (indexer/storage/vectors/faiss/store.py)."""


def training_threshold(spec: IndexSpec, tuning: SearchTuning) -> int:
    """Vectors a collection needs before `spec` replaces Flat: `CNCLIP_INDEX_TRAIN_MIN`, and never
    fewer than what every trained part of `spec` needs (`IndexSpec.training_points`: IVF lists, 2^bits
    per PQ codebook)."""
    if not spec.needs_training:
        return 0
    return max(tuning.train_min, spec.training_points)


def stored_spec(factory: str, dim: int) -> IndexSpec | None:
    """The parsed description of a stored collection; None for one an older version accepted by
    trying it in FAISS (`OPQ16,IVF64,PQ16`, `IVF64,SQ8`): such a collection is searched exactly
    (Flat) and never trained, rather than handing its text to FAISS."""
    try:
        return parse_index(factory, dim)
    except InvalidIndexDescription as exc:
        log.warning("index %r is not one this version builds (%s): searching it exactly (Flat)", factory, exc)
        return None


class VectorIndex:
    """A FAISS IndexIDMap2 plus what is needed to search it well and save it safely."""

    def __init__(
        self, dim: int, factory: str = "Flat", model: str = "", tuning: SearchTuning | None = None, owner: str = ""
    ) -> None:
        self.dim = dim
        self.owner = owner  # the collection's vector_key, written in the file's header
        self.factory = factory  # configured target, as stored (the file's metadata must match it)
        self.parsed = stored_spec(factory, dim)
        self.spec = self.parsed or FLAT  # what training builds
        self.model = model
        self.tuning = tuning or SearchTuning()
        self.active = "Flat"  # what the index is now: Flat, `factory` once trained (Auto: the IVF it trained)
        self.index: faiss.IndexIDMap2 = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        # Ids removed from an index that cannot remove (HNSW): filtered out of every search.
        self.tombstones: set[int] = set()
        # Vectors held when training last failed (0: it never did): the next try waits for twice as many.
        self.training_failed_at = 0
        self.nprobe: int | None = None  # Auto's IVF: the depth measured when trained (auto.py); else the setting
        self.lock = ReadWriteLock()
        self.files = IndexFiles(dim)  # the base file and its log, and what the next save appends

    # --- contents -------------------------------------------------------------------------
    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal) - len(self.tombstones)

    def ids(self) -> np.ndarray:
        with self.lock.read():
            ids = faiss.vector_to_array(self.index.id_map).astype(np.int64)
        if self.tombstones:
            ids = ids[~np.isin(ids, np.fromiter(self.tombstones, dtype=np.int64))]
        return ids

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids) == 0:
            return
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        with self.lock.write():
            self.index.add_with_ids(vectors, np.ascontiguousarray(ids, dtype=np.int64))
            self.files.changes.added(ids, vectors)

    def remove(self, ids: np.ndarray) -> None:
        if len(ids) == 0:
            return
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        with self.lock.write():
            # Only a Flat body removes in place: IndexIDMap2 compacts its id map as IndexFlat compacts
            # its rows, but an IVF keeps its entries' internal numbers, so removing there shifts every
            # later label onto another vector (search for id 600 answered 605). HNSW cannot remove.
            # Those hide the ids instead, until the index is rebuilt (Auto: `target`).
            if isinstance(faiss.downcast_index(self.index.index), faiss.IndexFlat):
                self.index.remove_ids(ids)  # type: ignore[arg-type]  # the numpy overload is not in faiss's stubs
            else:
                self.tombstones.update(int(i) for i in ids)
            self.files.changes.removed(ids)

    def replace_with(self, other: VectorIndex) -> None:
        """Swap in a rebuilt index (searches see the old one or the new one, never half of one)."""
        with self.lock.write():
            self.index, self.active, self.tombstones = other.index, other.active, other.tombstones
            self.nprobe = other.nprobe
            self.needs_full_save = True

    @property
    def needs_full_save(self) -> bool:
        """Whether the next save rewrites the base file (set after swapping in a rebuilt index:
        the log records changes to the base's index, not to another one)."""
        return self.files.changes.full_save

    @needs_full_save.setter
    def needs_full_save(self, value: bool) -> None:
        if value:  # only a save clears it
            self.files.changes.rewrite()

    # --- training -----------------------------------------------------------------------------
    @property
    def active_spec(self) -> IndexSpec:
        """What the index is now: Flat until trained, then the configured spec (Auto: the IVF it trained)."""
        if self.active == "Flat":
            return FLAT
        if self.spec.kind != "auto":
            return self.spec
        return parse_index(self.active, self.dim)  # checked when loaded: an IVF{n},Flat

    def target(self, count: int) -> IndexSpec | None:
        """The index to build for `count` vectors, when that is not what the index is now; else None."""
        if self.spec.kind == "auto":
            wanted = auto_target(count, self.active_spec, self.tuning.auto_ivf_min)
            # Removed vectors hidden (`remove`) are still scanned: past a quarter, rebuild without them.
            hidden = len(self.tombstones) > count // 4
            if wanted is None and hidden and self.active != "Flat" and count >= self.tuning.auto_ivf_min:
                return parse_index(f"IVF{auto_lists(count)},Flat", self.dim)
            return wanted
        if (
            self.active != self.factory
            and self.spec.needs_training
            and count >= training_threshold(self.spec, self.tuning)
        ):
            return self.spec
        return None

    def wants_training(self, count: int) -> bool:
        return self.target(count) is not None and count >= 2 * self.training_failed_at

    def build(
        self, ids: np.ndarray, fetch: FetchVectors, chunk: int = 20_000, cancelled: threading.Event | None = None
    ) -> VectorIndex:
        """A new index of this one's kind holding `ids` (vectors from `fetch`), trained if large enough.
        When FAISS cannot train it (a RuntimeError from native code), the new index is Flat — exact
        searches over the same vectors; the store keeps the index it has — and this one remembers the
        count, so training is tried again only once the collection has doubled: a collection whose
        index cannot be built is searched as before until it can, never broken.
        `cancelled` set (a drop or close) stops it between steps with `TrainingCancelled`."""
        fresh = VectorIndex(self.dim, self.factory, self.model, self.tuning, self.owner)
        fresh.training_failed_at = self.training_failed_at
        target = fresh.target(len(ids)) if fresh.wants_training(len(ids)) else None
        if target is not None:
            try:
                fresh.index = self._trained(target, ids, fetch)
                fresh.active = self.factory if self.spec.kind != "auto" else target.description
            except RuntimeError as exc:  # FAISS's C++ exceptions; the collection stays as it was
                self.training_failed_at = fresh.training_failed_at = len(ids)
                log.warning(
                    "index %s not trained on %d vectors, searching as before (%s) until %d: %s",
                    target.description, len(ids), self.active, 2 * len(ids), str(exc).strip().splitlines()[-1][:200],
                )  # fmt: skip
        # Auto measures how deep its IVF must search on these very vectors (indexer/storage/vectors/faiss/auto.py).
        probe = RecallProbe(ids, fetch) if self.spec.kind == "auto" and fresh.active != "Flat" else None
        for start in range(0, len(ids), chunk):
            if cancelled is not None and cancelled.is_set():
                raise TrainingCancelled(f"building {fresh.active} stopped: its collection is closing")
            part = ids[start : start + chunk]
            vectors = np.ascontiguousarray(fetch(part), dtype=np.float32)
            fresh.index.add_with_ids(vectors, part.astype(np.int64))
            if probe is not None:
                probe.observe(part, vectors)
        if probe is not None:
            self._settle_depth(fresh, probe, len(ids))
        return fresh

    def _settle_depth(self, fresh: VectorIndex, probe: RecallProbe, count: int) -> None:
        """Auto's IVF searches at the fewest lists that reach the target recall; when none within
        a quarter of them does, the new index goes back to Flat (exact is better for such data) and
        the next try waits for twice as many vectors."""
        lists = fresh.active_spec.lists
        depth = probe.depth(fresh.index, lists, self.tuning.nprobe)
        if depth.nprobe is not None:
            fresh.nprobe = depth.nprobe
            log.info(
                "%s on %d vectors: nprobe %d gives recall@10 %.3f", fresh.active, count, depth.nprobe, depth.recall
            )
            return
        log.warning(
            "%s on %d vectors reaches recall@10 %.3f visiting a quarter of its lists: searching as before (%s) until %d",
            fresh.active, count, depth.recall, self.active, 2 * count,
        )  # fmt: skip
        self.training_failed_at = fresh.training_failed_at = count
        fresh.index, fresh.active = as_flat(fresh.index, self.dim), "Flat"

    def _trained(self, spec: IndexSpec, ids: np.ndarray, fetch: FetchVectors) -> faiss.IndexIDMap2:
        """An empty id-mapped index of `spec` (the configured one, or Auto's IVF), trained on a sample of `ids`."""
        # Only the re-rendered description of a parsed spec reaches FAISS (indexer/domain/index_spec.py).
        inner = faiss.index_factory(self.dim, spec.description, faiss.METRIC_INNER_PRODUCT)
        ivf = faiss.try_extract_index_ivf(inner)
        # Any: faiss's stubs type downcast_index as the base Index, which lacks the IVF-PQ field.
        concrete: Any = faiss.downcast_index(ivf) if ivf is not None else None
        if hasattr(concrete, "do_polysemous_training"):
            # Polysemous training only serves Hamming pre-filtering, which we do not use, and is slow.
            concrete.do_polysemous_training = False
        if not inner.is_trained:
            # 64 points per IVF list (faiss wants ≥ 39), at least 50k for PQ codebooks.
            sample_size = min(len(ids), max(50_000, 64 * spec.lists))
            rng = np.random.default_rng(0)
            sample = np.sort(rng.choice(ids, size=sample_size, replace=False))
            inner.train(np.ascontiguousarray(fetch(sample), dtype=np.float32))
        return faiss.IndexIDMap2(inner)

    # --- search --------------------------------------------------------------------------------
    def _params(self, selector: faiss.IDSelector | None) -> faiss.SearchParameters | None:
        # faiss's stubs lack these keyword constructors; they exist at run time (faiss >= 1.7.3).
        inner = faiss.downcast_index(self.index.index)
        kind = self.active_spec.kind
        if kind == "hnsw" and hasattr(inner, "hnsw"):
            return faiss.SearchParametersHNSW(sel=selector, efSearch=self.tuning.ef_search)  # type: ignore[attr-defined,no-any-return]
        if kind in ("ivf_flat", "ivf_pq"):
            nprobe = self.nprobe or self.tuning.nprobe  # Auto's measured depth, else the setting
            return faiss.SearchParametersIVF(sel=selector, nprobe=nprobe)  # type: ignore[call-arg]
        return faiss.SearchParameters(sel=selector) if selector is not None else None  # type: ignore[call-arg]

    def search(
        self, query: np.ndarray, k: int, fetch: FetchVectors, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top `k` (ids, scores) for one L2-normalised query; `allowed` restricts to those ids."""
        query = np.ascontiguousarray(query, dtype=np.float32).reshape(1, self.dim)
        if allowed is not None and self.tombstones:
            allowed = allowed[~np.isin(allowed, np.fromiter(self.tombstones, dtype=np.int64))]
        complete = self.active == "Flat"  # exhaustive: nothing can be missed
        exact = complete or self.active_spec.exact_scores
        if allowed is not None and not complete and len(allowed) <= max(self.tuning.exact_filter_max, k):
            return _exact(query, allowed, fetch(allowed), k)
        with self.lock.read():
            total = int(self.index.ntotal)
            if total == 0:
                return np.empty(0, np.int64), np.empty(0, np.float32)
            want = k if exact else k * max(1, self.tuning.rerank_factor)
            want = min(want + len(self.tombstones), total)
            selector: faiss.IDSelector | None = None
            if allowed is not None:
                selector = faiss.IDSelectorBatch(np.ascontiguousarray(allowed, dtype=np.int64))
            elif self.tombstones:
                hidden = faiss.IDSelectorBatch(np.fromiter(self.tombstones, dtype=np.int64))
                selector = faiss.IDSelectorNot(hidden)
            scores, labels = self.index.search(query, want, params=self._params(selector))
        keep = labels[0] >= 0
        ids, scores = labels[0][keep], scores[0][keep]
        if not exact:
            ids, scores = _exact(query, ids, fetch(ids), k)  # re-rank with the stored vectors
        ids, scores = ids[:k], scores[:k]
        if allowed is not None and not complete and len(ids) < min(k, len(allowed)):
            # An approximate index can miss members of a narrow filter: never return too few.
            return _exact(query, allowed, fetch(allowed), k)
        return ids, scores

    # --- files ------------------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        """Append what changed since the last save to the log beside `path`, or write the whole index
        atomically (file.py: streamed, temp file, fsync, rename, fsync the folder) and drop the log
        (saving.py says which). A full disk is `StorageFull`; a failed save keeps the changes."""
        with self.lock.read():
            header = {
                "dim": self.dim,
                "factory": self.factory,
                "active": self.active,
                "model": self.model,
                "owner": self.owner,
                "tombstones": sorted(self.tombstones),
                "nprobe": self.nprobe,  # Auto's measured search depth (auto.py)
            }
            self.files.save(path, header, self.index)

    @classmethod
    def load(
        cls,
        path: Path,
        dim: int,
        factory: str,
        model: str,
        tuning: SearchTuning | None = None,
        owner: str | None = None,
    ) -> VectorIndex:
        """The index saved at `path`; IndexFileError says why it cannot be used. With `owner` (what
        a store opens), a file whose header names another owner, or none (saved before owners were
        written), is refused too: its ids may be another catalog's."""
        loaded = cls(dim, factory, model, tuning, owner or "")
        identity = file_identity(path)  # before reading: a file replaced since only costs a rewrite

        def accept(meta: dict[str, Any]) -> None:
            try:
                made_for = (meta["dim"], meta["factory"], meta["model"])
                loaded.active, loaded.tombstones = str(meta["active"]), {int(t) for t in meta["tombstones"]}
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise IndexFileError("unreadable header") from exc
            if made_for != (dim, factory, model):
                raise IndexFileError("made for another dim, factory or model")
            if owner is not None and meta.get("owner") != owner:
                raise IndexFileError(
                    f"made for another collection or catalog (owner {meta.get('owner')!r}, not {owner!r})"
                )
            loaded.owner = meta.get("owner") or ""
            nprobe = meta.get("nprobe")  # absent before Auto: the setting's
            if nprobe is not None and (not isinstance(nprobe, int) or not 1 <= nprobe <= 65_536):
                raise IndexFileError("unreadable header (nprobe)")
            loaded.nprobe = nprobe
            if loaded.active != "Flat" and loaded.parsed is None:
                # Trained by an older version from a description this one does not parse: rebuild as Flat.
                raise IndexFileError(f"trained as {factory!r}, an index this version does not build")
            if loaded.spec.kind == "auto" and loaded.active != "Flat" and not _auto_ivf(loaded.active, dim):
                raise IndexFileError(f"an Auto index trained as {loaded.active[:40]!r}, which Auto never builds")

        header, index = read_index_file(path, accept)
        if not isinstance(index, faiss.IndexIDMap2):
            raise IndexFileError("not an id-mapped index")
        # The header is checked above; the body must be what it says too (a body spliced in from
        # another index, whatever its header, would fail every add or search inside FAISS).
        if index.d != dim or index.metric_type != faiss.METRIC_INNER_PRODUCT or index.id_map.size() != index.ntotal:
            raise IndexFileError("its body is not the index its header describes (dimension, metric or ids)")
        if loaded.active == "Flat" and not isinstance(faiss.downcast_index(index.index), faiss.IndexFlat):
            raise IndexFileError("its header says Flat, its body is another index")
        loaded.index = index
        loaded._replay(path, identity, header)
        return loaded

    def _replay(self, path: Path, identity: tuple[int, int, int] | None, header: dict[str, Any]) -> None:
        """Apply the log of the base just loaded (saving.py): a log that stops early is rewritten away
        at the next save, and what it lacked the SQL catch-up on open adds back."""

        def apply(change: Change) -> None:
            if change.vectors is None:
                self.remove(change.ids)
            else:
                self.add(change.ids, change.vectors)

        problem = self.files.replay(path, identity, header, int(self.index.ntotal), apply)
        if problem:
            log.info("index %s: its log not replayed whole: %s", path.name, problem)


def _auto_ivf(active: str, dim: int) -> bool:
    """Whether `active` (a file header's) is an index Auto builds: IVF{n},Flat in the grammar."""
    try:
        return parse_index(active, dim).kind == "ivf_flat"
    except InvalidIndexDescription:
        return False


def _exact(query: np.ndarray, ids: np.ndarray, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    if len(ids) == 0:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    scores = vectors.reshape(len(ids), -1) @ query[0]
    top = np.argsort(-scores, kind="stable")[:k]
    return np.asarray(ids, dtype=np.int64)[top], scores[top].astype(np.float32)
