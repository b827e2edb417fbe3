"""FAISS vs Milvus Lite vs a real Milvus server through the project's own `VectorStore` code, on
the same clustered vectors.

    python benchmarks/bench_engines.py --sizes 100000 1000000            # the published run
    python benchmarks/bench_engines.py --sizes 5000 --queries 50         # a smoke run (a few minutes)
    python benchmarks/bench_engines.py --engines faiss milvus-server     # some engines only

The server is the `milvus` package's Milvus 2.3.5 standalone (a dev dependency), started once for
the whole run on free loopback ports by tests/support/real_milvus.py. For each size and index (Flat,
HNSW32, IVF{4·sqrt(n)},Flat) the engines run one after the other (interleaved, so a machine that
slows down during the run slows all), each in a fresh worker process so that its memory is its own:
build = upsert every vector in chunks + save (Milvus: flush and wait for the background index
build), memory = RSS after the build minus RSS with the data loaded (for Lite this includes
importing pymilvus and running the Lite server; for the server, the growth of the server process's
RSS plus the client's), then the store is closed and opened again and the first search after that
load is timed alone, then p50/p99 of one query at a time and recall@10 against exact search. Prints
a markdown table (and JSON with --json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_search import clustered_rows, exact_top  # noqa: E402
from indexer.storage.vectors.base import ItemAttrs, SearchTuning, StoreSpec  # noqa: E402

DIM = 512
ENGINES = ("faiss", "milvus-lite", "milvus-server")
CHUNK = 20_000  # vectors per upsert, as indexer/storage/sync.py fills a store
ATTRS = ItemAttrs(mime="image/jpeg", tags=(), created_at=datetime(2024, 1, 1))


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def process_rss_bytes(pid: int | None) -> int:
    """RSS of another process (the Milvus server); 0 for none."""
    if pid is None:
        return 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def open_engine(engine: str, workdir: Path, tuning: SearchTuning, server_uri: str | None) -> Any:
    if engine == "faiss":
        from indexer.storage.vectors.faiss.store import FaissEngine

        return FaissEngine(workdir / "faiss", tuning, save_interval_s=3600)
    from indexer.storage.vectors.milvus.store import MilvusEngine

    return MilvusEngine(server_uri if engine == "milvus-server" else str(workdir / "milvus.db"), "", tuning)


def wait_indexed(engine: Any, store: Any, n: int) -> None:
    """Milvus builds segment indexes in the background after a flush (a server only seals its
    segments when told to, or when they are full): a build is done when every row is indexed."""
    if engine.name != "milvus":
        return
    if not engine.lite:
        engine.client().flush(store.name)
    while True:
        index = engine.client().describe_index(store.name, "vector")
        if index.get("indexed_rows", 0) >= n and not index.get("pending_index_rows", 0):
            return
        time.sleep(0.05)


def worker(args: argparse.Namespace) -> None:
    """One engine, one index, one size: build, reload, search; prints one JSON line."""
    data = np.load(args.data)
    queries = np.load(args.queries)
    truth = np.load(args.truth)
    fetch = lambda ids: data[ids]  # noqa: E731  SQL's stored vectors, here in memory
    tuning = SearchTuning(nprobe=args.nprobe, ef_search=args.ef, train_min=min(10_000, len(data)))
    spec = StoreSpec(1, "bench", DIM, args.factory, "bench", "bench" + args.factory.replace(",", "").lower())
    server_pid = int(args.server_pid) if args.engine == "milvus-server" else None
    baseline = rss_bytes() + process_rss_bytes(server_pid)
    started = time.perf_counter()
    engine = open_engine(args.engine, Path(args.workdir), tuning, args.server_uri)
    store = engine.open(spec, fetch, lambda _: np.empty(0, np.int64))
    ids = np.arange(len(data), dtype=np.int64)
    for start in range(0, len(data), CHUNK):
        part = ids[start : start + CHUNK]
        store.upsert(part, data[part], [ATTRS] * len(part))
    store.save()
    wait_indexed(engine, store, len(data))
    build_s = time.perf_counter() - started
    memory = rss_bytes() + process_rss_bytes(server_pid) - baseline
    store.close()
    engine.close()

    started = time.perf_counter()
    engine = open_engine(args.engine, Path(args.workdir), tuning, args.server_uri)
    store = engine.open(spec, fetch, lambda _: np.empty(0, np.int64))
    open_s = time.perf_counter() - started
    started = time.perf_counter()
    store.search(queries[0], 10)
    first_ms = (time.perf_counter() - started) * 1000
    latencies, found = [], []
    for query in queries:
        started = time.perf_counter()
        hit_ids, _ = store.search(query, 10)
        latencies.append((time.perf_counter() - started) * 1000)
        found.append(hit_ids)
    recall = statistics.fmean(len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True))
    quantiles = statistics.quantiles(latencies, n=100, method="inclusive")
    if args.engine == "milvus-server":
        engine.drop(spec)  # the server outlives this worker: free its memory for the next run
    engine.close()
    row = {
        "engine": args.engine,
        "factory": args.factory,
        "n": len(data),
        "build_s": build_s,
        "memory_mb": memory / 2**20,
    }
    row.update(open_s=open_s, first_ms=first_ms, p50_ms=quantiles[49], p99_ms=quantiles[98], recall=recall)
    print(json.dumps(row))


def factories(n: int) -> list[str]:
    return ["Flat", "HNSW32", f"IVF{int(4 * math.sqrt(n))},Flat"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--nprobe", type=int, default=64)
    parser.add_argument("--ef", type=int, default=128)
    parser.add_argument("--factories", nargs="*", help="index descriptions (default: Flat, HNSW32, IVF{4·sqrt n},Flat)")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("engine", "factory", "data", "queries-file", "truth", "workdir", "server-uri", "server-pid"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.queries = args.queries_file
        worker(args)
        return

    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp, contextlib.ExitStack() as stack:
        server = None
        if "milvus-server" in args.engines:
            from tests.support.real_milvus import RealMilvus

            server = stack.enter_context(RealMilvus(Path(tmp) / "milvus-server"))
            print(
                f"  Milvus server {server.version} at {server.uri} ({server.startup_s:.1f} s to start)", file=sys.stderr
            )
        for n in args.sizes:
            data = clustered_rows(rng, n + args.queries, DIM)
            queries, data = data[: args.queries], data[args.queries :]  # held-out queries from the same clusters
            paths = {name: Path(tmp) / f"{name}-{n}.npy" for name in ("data", "queries", "truth")}
            np.save(paths["data"], data)
            np.save(paths["queries"], queries)
            np.save(paths["truth"], exact_top(data, queries, 10))
            del data
            for factory in args.factories or factories(n):
                for engine in args.engines:
                    workdir = Path(tmp) / f"{engine}-{n}-{factory.replace(',', '_')}"
                    command = [sys.executable, __file__, "--worker", "--engine", engine, "--factory", factory]
                    command += ["--data", str(paths["data"]), "--queries-file", str(paths["queries"])]
                    command += ["--truth", str(paths["truth"]), "--workdir", str(workdir)]
                    command += ["--nprobe", str(args.nprobe), "--ef", str(args.ef)]
                    if server is not None:
                        command += ["--server-uri", server.uri, "--server-pid", str(server.pid)]
                    done = subprocess.run(command, capture_output=True, text=True, check=False)
                    if done.returncode != 0:
                        raise SystemExit(f"{engine} {factory} n={n} failed:\n{done.stderr[-3000:]}")
                    rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                    print(f"  {engine:13} {factory:14} n={n}: done", file=sys.stderr)
    print_table(rows, args)
    if args.json:
        print(json.dumps(rows, indent=1))


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\n{DIM}-d clustered vectors, {args.queries} held-out queries, k=10, nprobe {args.nprobe}, ef {args.ef}\n")
    print("| n | index | engine | recall@10 | p50 ms | p99 ms | build s | memory MB | reopen s | first search ms |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['n']:,} | {r['factory']} | {r['engine']} | {r['recall']:.3f} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['build_s']:.1f} | {r['memory_mb']:.0f} | {r['open_s']:.2f} | {r['first_ms']:.1f} |"
        )


if __name__ == "__main__":
    main()
