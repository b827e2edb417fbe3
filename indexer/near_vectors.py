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
seeded training). Memory: the vectors (n·d float32) twice while the index lives, freed when the
search is done; the pairs kept are capped at `MAX_PAIRS` by raising the threshold (reported).
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
FETCH_CHUNK = 20_000
MAX_PAIRS = 500_000

FetchVectors = Callable[[np.ndarray], np.ndarray]  # ids -> (len(ids), dim) float32 (unit), same order


class ShotSearch:
    """The pairs search over `ids` (sorted), resumable across calls of `run`."""

    def __init__(self, ids: np.ndarray, fetch: FetchVectors, threshold: float) -> None:
        self.ids = np.asarray(ids, dtype=np.int64)
        self.fetch = fetch
        self.threshold = threshold  # raised when the pairs would pass MAX_PAIRS
        self.cursor = 0  # queries done
        self.pairs: dict[tuple[int, int], float] = {}  # (id, id) with the smaller id first -> cosine
        self._vectors: np.ndarray | None = None
        self._index: faiss.Index | None = None

    @property
    def complete(self) -> bool:
        return self.cursor >= len(self.ids)

    @property
    def holds_index(self) -> bool:
        return self._index is not None

    def release(self) -> None:
        """Free the vectors and the index (rebuilt when `run` needs them again)."""
        self._vectors = None
        self._index = None

    def run(self, deadline: float | None) -> None:
        """Search chunks of queries until done or past `deadline` (monotonic; None: until done). At
        least one chunk runs per call, so every call makes progress."""
        if self.complete:
            return
        if self._index is None:
            self._build()
        assert self._vectors is not None and self._index is not None
        first = True
        while not self.complete and (first or deadline is None or time.monotonic() < deadline):
            first = False
            stop = min(self.cursor + QUERY_CHUNK, len(self.ids))
            scores, found = self._index.search(self._vectors[self.cursor : stop], min(NEIGHBOURS + 1, len(self.ids)))
            self._keep(np.arange(self.cursor, stop), scores, found)
            self.cursor = stop
        if self.complete:
            self.release()

    def _build(self) -> None:
        started = time.perf_counter()
        n = len(self.ids)
        vectors = np.empty((n, 0), dtype=np.float32)
        for start in range(0, n, FETCH_CHUNK):
            part = np.ascontiguousarray(self.fetch(self.ids[start : start + FETCH_CHUNK]), dtype=np.float32)
            if start == 0:
                vectors = np.empty((n, part.shape[1]), dtype=np.float32)
            vectors[start : start + len(part)] = part
        dim = vectors.shape[1]
        if n <= EXACT_UP_TO:
            index: faiss.Index = faiss.IndexFlatIP(dim)
        else:
            lists = int(2 * math.sqrt(n))
            quantizer = faiss.IndexFlatIP(dim)
            ivf = faiss.IndexIVFFlat(quantizer, dim, lists, faiss.METRIC_INNER_PRODUCT)
            ivf.cp.niter = 10
            ivf.cp.max_points_per_centroid = 40  # a sample of 40 per list trains well enough, fast
            ivf.cp.seed = 1234  # the same index every time it is rebuilt
            ivf.train(vectors)
            ivf.nprobe = NPROBE
            index = ivf
        index.add(vectors)
        self._vectors, self._index = vectors, index
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
