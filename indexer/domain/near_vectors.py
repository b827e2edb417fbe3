"""Pairs of items whose stored vectors are at least a cosine threshold apart: the "similar shots" tier
of near-duplicate groups, found through a vector index, never by comparing all pairs.

Each item asks for its `NEIGHBOURS` nearest (twice as many as a group may hold, so that in a burst of
near-equal shots a pair is missed only when neither member has the other among its nearest: with as
many as a group, 50 shots at 0.99 fell apart into groups of 10) in a temporary FAISS index
built from the vectors in SQL; pairs at or above the threshold are kept. The collection's own vector
store is not used: its protocol answers one query at a time (100k round trips to Milvus), and a Flat
store would compare all pairs. Below `EXACT_UP_TO` items the temporary index is exact (Flat: one
matrix product per chunk); above, an inverted file (IVF, √n·2 lists, `NPROBE` visited: near-identical
vectors share a list or a neighbouring one; the recall is measured by benchmarks/bench_duplicates.py).

Bounded: the search goes in chunks of queries and stops at a deadline, keeping its place, so the
next call goes on from there (the index is kept meanwhile, or rebuilt identically: same ids, same
seeded training sample). Memory: the vectors once (n·d float32, inside the index: queries are read
back from it), filled from SQL in chunks and freed when the search is done; the pairs kept are capped
at `MAX_PAIRS` by raising the threshold (reported).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import faiss
import numpy as np

log = logging.getLogger(__name__)

NEIGHBOURS = 64  # nearest items each item asks for
EXACT_UP_TO = 10_000  # items: Flat (exact) up to here, IVF above
NPROBE = 8
QUERY_CHUNK = 2048
FETCH_CHUNK = 5_000  # vectors read from SQL at a time
TRAIN_PER_LIST = 40  # IVF training sample: this many vectors per list
MAX_PAIRS = 500_000

FetchVectors = Callable[[np.ndarray], np.ndarray]  # ids -> (len(ids), dim) float32 (unit), same order


class ShotSearch:
    """The pairs search over `ids` (sorted), resumable across calls of `run`."""

    def __init__(self, ids: np.ndarray, fetch: FetchVectors, threshold: float, dim: int) -> None:
        self.ids = np.asarray(ids, dtype=np.int64)
        self.fetch = fetch
        self.dim = dim
        self.threshold = threshold  # raised when the pairs would pass MAX_PAIRS
        self.cursor = 0  # queries done
        self.pairs: dict[tuple[int, int], float] = {}  # (id, id) with the smaller id first -> cosine
        self._index: faiss.Index | None = None

    @property
    def complete(self) -> bool:
        return self.cursor >= len(self.ids)

    @property
    def holds_index(self) -> bool:
        return self._index is not None

    def release(self) -> None:
        """Free the index and its vectors (rebuilt when `run` needs them again)."""
        self._index = None

    def run(self, deadline: float | None) -> None:
        """Search chunks of queries until done or past `deadline` (monotonic; None: until done). At
        least one chunk runs per call, so every call makes progress."""
        if self.complete:
            return
        if self._index is None:
            self._build()
        assert self._index is not None
        first = True
        while not self.complete and (first or deadline is None or time.monotonic() < deadline):
            first = False
            stop = min(self.cursor + QUERY_CHUNK, len(self.ids))
            queries = self._index.reconstruct_batch(np.arange(self.cursor, stop, dtype=np.int64))
            scores, found = self._index.search(queries, min(NEIGHBOURS + 1, len(self.ids)))
            self._keep(np.arange(self.cursor, stop), scores, found)
            self.cursor = stop
        if self.complete:
            self.release()

    def _vectors(self, ids: np.ndarray) -> np.ndarray:
        """Stored vectors of `ids`; rows deleted meanwhile are zero (they pair with nothing)."""
        vectors = np.ascontiguousarray(self.fetch(ids), dtype=np.float32)
        if vectors.shape != (len(ids), self.dim):  # every one of them deleted: no dimension to read
            return np.zeros((len(ids), self.dim), dtype=np.float32)
        return vectors

    def _build(self) -> None:
        """The index of every vector, in `ids` order (its positions are positions in `ids`)."""
        started = time.perf_counter()
        n = len(self.ids)
        index: faiss.Index
        if n <= EXACT_UP_TO:
            index = faiss.IndexFlatIP(self.dim)
        else:
            lists = int(2 * math.sqrt(n))
            ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(self.dim), self.dim, lists, faiss.METRIC_INNER_PRODUCT)
            ivf.cp.niter = 10
            ivf.cp.seed = 1234
            # A fixed sample (the same index every time it is rebuilt), read on its own: the full set
            # of vectors is never held outside the index.
            sample = np.random.default_rng(1234).choice(n, min(n, lists * TRAIN_PER_LIST), replace=False)
            ivf.train(self._vectors(self.ids[np.sort(sample)]))
            ivf.nprobe = NPROBE
            index = ivf
        for start in range(0, n, FETCH_CHUNK):
            index.add(self._vectors(self.ids[start : start + FETCH_CHUNK]))
        if isinstance(index, faiss.IndexIVF):
            index.make_direct_map()  # queries are read back by position
        self._index = index
        log.info(
            "duplicates: %s index of %d vectors built in %.1f s", type(index).__name__, n, time.perf_counter() - started
        )

    def _keep(self, queries: np.ndarray, scores: np.ndarray, found: np.ndarray) -> None:
        """Record the (query, neighbour) pairs at or above the threshold, each pair once."""
        rows, cols = np.nonzero((scores >= self.threshold) & (found >= 0) & (found != queries[:, None]))
        left, right = self.ids[queries[rows]], self.ids[found[rows, cols]]
        for a, b, score in zip(
            np.minimum(left, right).tolist(), np.maximum(left, right).tolist(), scores[rows, cols].tolist(), strict=True
        ):
            if score > self.pairs.get((a, b), -2.0):
                self.pairs[(a, b)] = score
        if len(self.pairs) > MAX_PAIRS:
            self._raise_threshold()

    def _raise_threshold(self) -> None:
        """Keep the strongest half of MAX_PAIRS: the threshold becomes the weakest score kept."""
        scores = np.fromiter(self.pairs.values(), dtype=np.float32, count=len(self.pairs))
        self.threshold = float(np.partition(scores, len(scores) - MAX_PAIRS // 2)[len(scores) - MAX_PAIRS // 2])
        self.pairs = {pair: s for pair, s in self.pairs.items() if s >= self.threshold}
        log.warning("duplicates: too many similar pairs; the threshold is raised to %.4f", self.threshold)
