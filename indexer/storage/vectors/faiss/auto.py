"""How deep `Auto`'s IVF searches: the fewest lists a search visits (nprobe) for recall@10 ≥ 0.95
against exact search, measured on the collection's own vectors each time Auto trains.

Why measured, not set: IVF's recall depends on the data. On clustered vectors IVF{4√n} finds every
true neighbour at nprobe 16; on vectors with little structure (512-d points barely nearer each other
than to the rest) it finds fewer than half at nprobe 64 (docs/indexing.md#auto has both). A fixed
`CNCLIP_INDEX_NPROBE` would be wasted on the first and wrong on the second. So while the new index is
filled (indexer/storage/vectors/faiss/index.py `VectorIndex.build`), `RecallProbe` keeps the exact top
10 of a sample of the collection's own vectors (each query's own id left out), then tries nprobe from
`CNCLIP_INDEX_NPROBE` upwards, doubling, and keeps the first that reaches `TARGET_RECALL`. When even a
quarter of the lists does not (a search would cost a quarter of Flat's and still miss), Auto stays
Flat: exact is the better index for such data.
"""

from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np

from indexer.storage.vectors.base import FetchVectors

TARGET_RECALL = 0.95
PROBE_QUERIES = 100  # recall in steps of 0.001; costs one exact pass of 100 queries over the vectors
K = 10
MOST_LISTS_VISITED = 4  # a search visiting more than 1/4 of the lists: Flat is as good (exact, no training)


@dataclass(frozen=True)
class Depth:
    """What the probe found: the nprobe chosen (None: none reached the target), and its recall."""

    nprobe: int | None
    recall: float


class RecallProbe:
    """Exact top-10 neighbours of a sample of the vectors, gathered chunk by chunk as they are added."""

    def __init__(self, ids: np.ndarray, fetch: FetchVectors, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        picked = np.sort(rng.choice(len(ids), size=min(PROBE_QUERIES, len(ids)), replace=False))
        self.query_ids = np.asarray(ids, dtype=np.int64)[picked]
        self.queries = np.ascontiguousarray(fetch(self.query_ids), dtype=np.float32)
        # K + 1: each query finds itself first; its own id is left out of both sides of the recall.
        self.best_scores = np.full((len(self.query_ids), K + 1), -np.inf, dtype=np.float32)
        self.best_ids = np.full((len(self.query_ids), K + 1), -1, dtype=np.int64)

    def observe(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Fold one added chunk into the exact top K + 1 of every query."""
        if len(ids) == 0:
            return
        scores = np.concatenate([self.best_scores, self.queries @ vectors.T], axis=1)
        labels = np.concatenate([self.best_ids, np.broadcast_to(ids, (len(self.queries), len(ids)))], axis=1)
        keep = np.argpartition(-scores, K, axis=1)[:, : K + 1]
        self.best_scores = np.take_along_axis(scores, keep, axis=1)
        self.best_ids = np.take_along_axis(labels, keep, axis=1)

    def recall(self, index: faiss.IndexIDMap2, nprobe: int) -> float:
        """Recall@10 of `index` searched at `nprobe` against the exact neighbours observed."""
        params = faiss.SearchParametersIVF(nprobe=nprobe)  # type: ignore[call-arg]
        _, found = index.search(self.queries, K + 1, params=params)
        order = np.argsort(-self.best_scores, axis=1, kind="stable")
        truth = np.take_along_axis(self.best_ids, order, axis=1)
        hits = wanted = 0
        for own, exact, got in zip(self.query_ids, truth, found, strict=True):
            expected = {int(i) for i in [i for i in exact if i >= 0 and i != own][:K]}
            hits += len(expected & {int(i) for i in [i for i in got if i >= 0 and i != own][:K]})
            wanted += len(expected)
        return hits / wanted if wanted else 1.0

    def depth(self, index: faiss.IndexIDMap2, lists: int, start: int) -> Depth:
        """The fewest lists from `start` up (doubling) reaching `TARGET_RECALL`, within a quarter of them."""
        most = max(1, lists // MOST_LISTS_VISITED)
        nprobe = max(1, min(start, lists))
        while True:
            recall = self.recall(index, nprobe)
            if recall >= TARGET_RECALL:
                return Depth(nprobe, recall)
            if nprobe >= most:
                return Depth(None, recall)
            nprobe = min(2 * nprobe, most)


def as_flat(index: faiss.IndexIDMap2, dim: int) -> faiss.IndexIDMap2:
    """The same ids and vectors in an exact (Flat) index: an IVF,Flat keeps its vectors whole."""
    ivf = faiss.extract_index_ivf(index.index)
    ivf.make_direct_map()
    vectors = index.index.reconstruct_n(0, index.ntotal)
    flat = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
    flat.add_with_ids(vectors, faiss.vector_to_array(index.id_map).astype(np.int64))
    return flat
