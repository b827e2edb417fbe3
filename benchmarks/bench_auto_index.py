"""Where `Auto` should leave Flat: one query's search time, Flat vs the IVF `Auto` trains
(`IVF{≈4√n},Flat`), and recall@10 against exact search at a few nprobe values.

    python benchmarks/bench_auto_index.py                         # 20k, 50k, 100k at dim 512
    python benchmarks/bench_auto_index.py --sizes 5000 --queries 50   # a smoke run

Every search goes through `VectorIndex.search` (the catalog's code path) on one FAISS thread, as an
API worker runs it. Vectors are clustered (1000 centres, like real embeddings far from uniform);
three kinds of query: `near` a stored vector (+ small noise), `held-out` a new point of the same
clusters, `far` a direction with cosine ≈ 0.3 to a centre (a text query's distance to its photos).
Prints one JSON row per (n, index, nprobe); docs/indexing.md#auto holds the numbers that set
`CNCLIP_INDEX_AUTO_IVF_MIN` and `CNCLIP_INDEX_NPROBE`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import faiss
import numpy as np

from indexer.domain.index_spec import auto_lists
from indexer.storage.vectors.base import SearchTuning
from indexer.storage.vectors.faiss.index import VectorIndex


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def dataset(n: int, dim: int, queries: int, spread: float, seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    centres = unit(rng.standard_normal((1000, dim), dtype=np.float32))
    spread = spread / math.sqrt(dim)

    def around(count: int) -> np.ndarray:
        picked = centres[rng.integers(0, len(centres), count)]
        return unit(picked + spread * rng.standard_normal((count, dim), dtype=np.float32))

    data = around(n)
    near = unit(data[rng.integers(0, n, queries)] + 0.02 * rng.standard_normal((queries, dim), dtype=np.float32))
    noise = unit(rng.standard_normal((queries, dim), dtype=np.float32))
    far = unit(0.3 * centres[rng.integers(0, len(centres), queries)] + 0.95 * noise)
    return data, {"near": near, "held-out": around(queries), "far": far}


def timed(index: VectorIndex, data: np.ndarray, queries: np.ndarray, k: int) -> tuple[float, list[np.ndarray]]:
    fetch = lambda ids: data[ids]  # noqa: E731 - the stored vectors, as the catalog reads them from SQL
    found, latencies = [], []
    for query in queries:
        started = time.perf_counter()
        ids, _ = index.search(query, k, fetch)
        latencies.append(time.perf_counter() - started)
        found.append(ids)
    return statistics.median(latencies) * 1000, found


def recall(found: list[np.ndarray], truth: list[np.ndarray], k: int) -> float:
    return sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(found, truth, strict=True)) / (len(truth) * k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 50_000, 100_000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--nprobes", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument(
        "--spread", type=float, default=0.6, help="noise around each centre (×1/√dim): 0.6 tight clusters, 3 loose"
    )
    args = parser.parse_args()
    for n in args.sizes:
        data, kinds = dataset(n, args.dim, args.queries, args.spread)
        ids = np.arange(n, dtype=np.int64)
        fetch = data.__getitem__  # the stored vectors, as the catalog reads them from SQL
        flat = VectorIndex(args.dim, "Flat", "bench").build(ids, fetch)
        faiss.omp_set_num_threads(2)  # training uses both cores, as the background trainer may
        started = time.perf_counter()
        ivf = VectorIndex(args.dim, "Auto", "bench", SearchTuning(auto_ivf_min=1)).build(ids, fetch)
        train_s = time.perf_counter() - started
        faiss.omp_set_num_threads(1)  # a search runs on one API worker thread
        for kind, queries in kinds.items():
            flat_ms, truth = timed(flat, data, queries, args.k)
            row = {"n": n, "spread": args.spread, "queries": kind, "index": "Flat", "median_ms": round(flat_ms, 3)}
            print(json.dumps(row), flush=True)
            for nprobe in args.nprobes:
                ivf.tuning = SearchTuning(nprobe=nprobe, auto_ivf_min=1)
                ivf_ms, found = timed(ivf, data, queries, args.k)
                row = {
                    "n": n,
                    "spread": args.spread,
                    "queries": kind,
                    "index": ivf.active,
                    "lists": auto_lists(n),
                    "nprobe": nprobe,
                    "median_ms": round(ivf_ms, 3),
                    "speedup_vs_flat": round(flat_ms / ivf_ms, 2),
                    "recall_at_10": round(recall(found, truth, args.k), 4),
                    "train_s": round(train_s, 1),
                }
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
