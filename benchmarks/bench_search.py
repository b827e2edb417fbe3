"""Search latency and recall@10 of the catalog's FAISS indexes: Flat vs IVF vs HNSW (with exact re-rank).

    python benchmarks/bench_search.py --sizes 10000 100000 1000000

Each index goes through `indexer.storage.vectors.faiss.index.VectorIndex.search`, the code path the catalog uses
(re-ranking the top k·r candidates exactly from the stored vectors, here a numpy array instead of
SQL). Recall@10 is against exact search; latency is one query at a time on one thread (as an API
worker thread runs it), median and p95 over the queries. Memory is the serialized index per vector.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from datetime import UTC, datetime

import faiss
import numpy as np

from indexer.storage.vectors.base import SearchTuning
from indexer.storage.vectors.faiss.index import VectorIndex


def unit_rows(rng: np.random.Generator, n: int, dim: int, chunk: int = 100_000) -> np.ndarray:
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, chunk):
        block = rng.standard_normal((min(chunk, n - start), dim), dtype=np.float32)
        out[start : start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def clustered_rows(rng: np.random.Generator, n: int, dim: int, clusters: int = 1000) -> np.ndarray:
    """Points around random centres (closer to real embeddings, which are far from uniform)."""
    centres = unit_rows(rng, clusters, dim)
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 100_000):
        m = min(100_000, n - start)
        block = centres[rng.integers(0, clusters, m)] + 0.6 / math.sqrt(dim) * rng.standard_normal(
            (m, dim), dtype=np.float32
        )
        out[start : start + m] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def exact_top(data: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    index = faiss.IndexFlatIP(data.shape[1])
    index.add(data)
    return index.search(queries, k)[1]


def build(data: np.ndarray, factory: str, tuning: SearchTuning) -> tuple[VectorIndex, float]:
    """A VectorIndex holding `data` with ids 0..n-1, trained as the catalog trains it."""
    started = time.perf_counter()
    index = VectorIndex(data.shape[1], factory, "bench", tuning)
    built = index.build(np.arange(len(data), dtype=np.int64), lambda ids: data[ids])
    return built, time.perf_counter() - started


def measure(index: VectorIndex, data: np.ndarray, queries: np.ndarray, truth: np.ndarray, k: int) -> dict[str, float]:
    fetch = lambda ids: data[ids]  # noqa: E731 - the stored vectors, as the catalog reads them from SQL
    latencies, hits = [], 0
    for query, expected in zip(queries, truth, strict=True):
        started = time.perf_counter()
        ids, _ = index.search(query, k, fetch)
        latencies.append(time.perf_counter() - started)
        hits += len(set(ids.tolist()) & set(expected.tolist()))
    latencies.sort()
    return {
        "recall_at_10": hits / (len(queries) * k),
        "median_ms": statistics.median(latencies) * 1000,
        "p95_ms": latencies[int(0.95 * (len(latencies) - 1))] * 1000,
    }


def configs(n: int) -> list[tuple[str, SearchTuning]]:
    # ~√n lists (a power of two): training more lists on 2 cores takes longer than the whole run.
    nlist = 1 << max(4, round(math.log2(math.sqrt(n))))
    out = [("Flat", SearchTuning())]
    for nprobe in (8, 32, 128):
        out.append((f"IVF{nlist},Flat", SearchTuning(nprobe=nprobe, rerank_factor=1, train_min=1)))
    for ef in (64, 128, 256):
        out.append(("HNSW32", SearchTuning(ef_search=ef, rerank_factor=4, train_min=1)))
    return out


def data_and_queries(args: argparse.Namespace, n: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` unit rows of the chosen kind, and unit queries (random ones, or near stored rows for clustered data)."""
    rng = np.random.default_rng(n)
    make = unit_rows if args.data == "random" else clustered_rows
    data = make(rng, n, args.dim)
    queries = (
        make(np.random.default_rng(n + 1), args.queries, args.dim)
        if args.data == "random"
        else (
            data[rng.integers(0, n, args.queries)]
            + 0.02 * rng.standard_normal((args.queries, args.dim), dtype=np.float32)
        )
    )
    return data, (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)


def size_rows(args: argparse.Namespace, n: int) -> list[dict]:
    """One row per index configuration at `n` vectors (HNSW only up to --hnsw-max)."""
    data, queries = data_and_queries(args, n)
    truth = exact_top(data, queries, args.k)
    flat_ms = None
    built_at: dict[str, tuple[VectorIndex, float]] = {}
    rows = []
    for factory, tuning in configs(n):
        if factory.startswith("HNSW") and n > args.hnsw_max:
            continue
        faiss.omp_set_num_threads(2)  # building uses both cores
        if factory not in built_at:
            built_at.clear()  # one index in memory at a time
            built_at[factory] = build(data, factory, tuning)
        index, seconds = built_at[factory]
        index.tuning = tuning
        faiss.omp_set_num_threads(1)  # a search runs on one API worker thread
        result = measure(index, data, queries, truth, args.k)
        flat_ms = flat_ms or result["median_ms"]
        knob = f"nprobe={tuning.nprobe}" if "IVF" in factory else f"ef={tuning.ef_search}" if "HNSW" in factory else "-"
        row = {
            "n": n,
            "index": factory,
            "knob": knob,
            "rerank": tuning.rerank_factor if factory != "Flat" else 0,
            **{key: round(value, 4) for key, value in result.items()},
            "speedup_vs_flat": round(flat_ms / result["median_ms"], 2),
            "bytes_per_vector": round(len(faiss.serialize_index(index.index)) / n),
            "build_s": round(seconds, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--data", choices=["random", "clustered"], default="random")
    parser.add_argument(
        "--hnsw-max", type=int, default=100_000, help="build HNSW only up to this size (slow on 2 cores)"
    )
    parser.add_argument("--json", dest="json_out", help="also write the rows to this file")
    args = parser.parse_args()
    print(
        f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {faiss.omp_get_max_threads()} threads, data={args.data}"
    )
    rows = [row for n in args.sizes for row in size_rows(args, n)]
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
