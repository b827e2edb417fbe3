"""Duplicate-finding time and memory at 100k items: `GET /v1/collections/{name}/duplicates`'s work
(indexer/service/duplicates.py) on a real catalog, against exact all-pairs search side by side.

    python benchmarks/bench_duplicates.py --size 100000 --rounds 3        # the published run
    python benchmarks/bench_duplicates.py --size 5000 --rounds 1          # a smoke run (about a minute)

A SQLite catalog (or --database-url) is filled once with synthetic data: `--size` items of `--dim`-d
clustered unit vectors (benchmarks/bench_search.py's generator), of which 5 % are bursts of 2 to 6
similar shots (cosine 0.97-0.99 to the burst's first) and 2 % resized copies (the same vector ±0.005,
a perceptual hash 0-4 bits away); every other item has a random 64-bit hash. Then, in rounds, each
mode runs in a fresh process (so its memory is its own), interleaved (a machine that slows down
slows both):
- `index`: the finder as shipped (an IVF index above 10,000 items);
- `exact`: the same finder with the exact (Flat) search at every size: all pairs, the baseline.
Each reports: seconds for the resized tier (multi-index hashing + the cosine check), for building the
temporary index (vectors read from SQL), for the similar-shots search, and in all for a cold call
(budget unlimited); a second, cached call; peak RSS growth; pairs and groups found; and (for `index`)
the share of the exact run's similar pairs it found. Prints a markdown table (and JSON with --json)
with medians and min/max over rounds and the index/exact ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_search import clustered_rows  # noqa: E402

MODES = ("index", "exact")
THRESHOLD = 0.95  # the unmeasured default every real checkpoint gets
INSERT_CHUNK = 5000


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    with open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores ({cpu}), load average {os.getloadavg()[0]:.2f}"


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def synthetic(size: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(vectors, hashes) with planted bursts and resized copies (see the module docstring)."""
    rng = np.random.default_rng(seed)
    vectors = clustered_rows(rng, size, dim)
    hashes = rng.integers(-(2**63), 2**63 - 1, size, dtype=np.int64)
    position = 0
    while position < size * 0.05:
        burst = int(rng.integers(2, 7))
        first = vectors[position]
        for i in range(position + 1, min(position + burst, size)):
            cosine = rng.uniform(0.97, 0.99)
            noise = rng.standard_normal(dim).astype(np.float32)
            noise -= noise @ first * first
            vectors[i] = cosine * first + np.sqrt(1 - cosine**2) * noise / np.linalg.norm(noise)
        position += burst
    for i in range(position, position + int(size * 0.02) * 2, 2):
        if i + 1 >= size:
            break
        vectors[i + 1] = vectors[i] + 0.005 * rng.standard_normal(dim).astype(np.float32)
        flips = rng.choice(64, int(rng.integers(0, 5)), replace=False)
        unsigned = int(hashes[i]) & (2**64 - 1)
        for bit in flips:
            unsigned ^= 1 << int(bit)
        hashes[i + 1] = unsigned - 2**64 if unsigned >= 2**63 else unsigned
    return _unit(vectors), hashes


def fill(database_url: str, data_dir: Path, size: int, dim: int) -> None:
    from indexer.domain.records import NewImage
    from indexer.runtime import open_catalog
    from tests.support.indexer_helpers import catalog_settings

    vectors, hashes = synthetic(size, dim)
    catalog = open_catalog(catalog_settings(data_dir, database_url), open_stores=False)
    try:
        catalog.create_collection("bench", "images", "bench-model", dim)
        for start in range(0, size, INSERT_CHUNK):
            stop = min(start + INSERT_CHUNK, size)
            images = [
                NewImage(
                    data=b"",
                    path=f"/bench/{i:07d}.jpg",
                    sha256=f"{i:064x}",
                    mime="image/jpeg",
                    width=4000 - i % 7,
                    height=3000,
                    phash=int(hashes[i]),
                    taken_source="mtime",
                )
                for i in range(start, stop)
            ]
            catalog.add_images("bench", images, vectors[start:stop])
    finally:
        catalog.close()


def rss_mb() -> float:
    with open("/proc/self/status", encoding="utf-8") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class PeakRss:
    """The highest RSS seen while the block runs, sampled every 20 ms (the kernel's own high-water mark
    is not kept current once memory is given back)."""

    def __enter__(self) -> PeakRss:
        self.start = self.peak = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


def worker(database_url: str, data_dir: Path, mode: str) -> dict[str, Any]:
    """One cold and one cached call of the finder, timed by stage (run in a fresh process)."""
    from indexer.domain import near_vectors
    from indexer.runtime import open_catalog
    from indexer.service import duplicates
    from tests.support.indexer_helpers import catalog_settings

    if mode == "exact":
        near_vectors.EXACT_UP_TO = 10**12
    stages: dict[str, float] = {"resized_s": 0.0, "build_s": 0.0}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                stages[name] += time.perf_counter() - started

        return wrapper

    duplicates.DuplicateFinder._resized = timed("resized_s", duplicates.DuplicateFinder._resized)  # type: ignore[method-assign]
    near_vectors.ShotSearch._build = timed("build_s", near_vectors.ShotSearch._build)  # type: ignore[method-assign]
    catalog = open_catalog(catalog_settings(data_dir, database_url), open_stores=False)
    try:
        finder = duplicates.DuplicateFinder(catalog, catalog.duplicates)
        state = catalog.collection("bench")
        with PeakRss() as memory:
            started = time.perf_counter()
            page = finder.find(state, "all", 0, 20, threshold=THRESHOLD)
            cold = time.perf_counter() - started
        snapshot = next(iter(finder._cache.values()))
        started = time.perf_counter()
        finder.find(state, "all", 0, 20, threshold=THRESHOLD)
        cached = time.perf_counter() - started
        pairs = sorted(snapshot.shots.pairs)
    finally:
        catalog.close()
    return {
        "mode": mode,
        "cold_s": cold,
        "resized_s": stages["resized_s"],
        "build_s": stages["build_s"],
        "search_s": cold - stages["resized_s"] - stages["build_s"],
        "cached_ms": cached * 1000,
        "peak_rss_mb": memory.peak - memory.start,
        "similar_pairs": len(pairs),
        "pairs": pairs,
        "groups": dict(page.counts),
    }


def run_worker(database_url: str, data_dir: Path, mode: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", mode, "--database-url", database_url, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def _cell(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def table(results: dict[str, list[dict[str, Any]]], size: int, dim: int) -> str:
    keys = [
        ("cold_s", "cold call, s", ".2f"),
        ("resized_s", "resized tier, s", ".2f"),
        ("build_s", "index build, s", ".2f"),
        ("search_s", "similar search, s", ".2f"),
        ("cached_ms", "cached call, ms", ".1f"),
        ("peak_rss_mb", "peak RSS growth, MB", ".0f"),
    ]
    rows = [f"| {size:,} × {dim}-d | " + " | ".join(m for m in MODES) + " | index/exact |", "| --- |" + " --- |" * 3]
    for key, title, fmt in keys:
        medians = {m: statistics.median(r[key] for r in results[m]) for m in MODES}
        ratio = medians["index"] / medians["exact"] if medians["exact"] else float("nan")
        rows.append(
            f"| {title} | " + " | ".join(_cell([r[key] for r in results[m]], fmt) for m in MODES) + f" | {ratio:.2f} |"
        )
    exact_pairs = set(map(tuple, results["exact"][0]["pairs"]))
    found = set(map(tuple, results["index"][0]["pairs"]))
    recall = len(found & exact_pairs) / len(exact_pairs) if exact_pairs else 1.0
    rows.append(f"| similar pairs (recall of exact) | {len(found)} ({recall:.4f}) | {len(exact_pairs)} | |")
    rows.append(f"| groups | {results['index'][0]['groups']} | {results['exact'][0]['groups']} | |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.database_url, args.data_dir, args.worker)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-duplicates-") as tmp:
        data_dir = args.data_dir or Path(tmp)
        url = args.database_url or f"sqlite:///{data_dir / 'catalog.db'}"
        print(f"{machine()}; filling {args.size:,} items…", file=sys.stderr)
        started = time.perf_counter()
        fill(url, data_dir, args.size, args.dim)
        print(f"filled in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        results: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        for round_number in range(args.rounds):
            for mode in MODES if round_number % 2 == 0 else reversed(MODES):
                results[mode].append(run_worker(url, data_dir, mode))
                print(f"round {round_number + 1} {mode}: {results[mode][-1]['cold_s']:.1f} s", file=sys.stderr)
    print(f"{machine()} (at the end); {time.strftime('%Y-%m-%d')}")
    print(table(results, args.size, args.dim))
    if args.json:
        print(json.dumps({m: [{k: v for k, v in r.items() if k != "pairs"} for r in rs] for m, rs in results.items()}))


if __name__ == "__main__":
    main()
