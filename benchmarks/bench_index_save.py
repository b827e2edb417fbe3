"""What saving a collection's FAISS index costs after adding 200 vectors, by collection size: the whole
file rewritten (before issue 34, and still what a compaction does) against an append to its log
(indexer/storage/vectors/faiss/saving.py), and what opening it then costs (base + log replay).

    python benchmarks/bench_index_save.py                     # 10k, 100k, 300k vectors of 512 dims
    python benchmarks/bench_index_save.py --sizes 10000,1000000 --rounds 5

Each size: a Flat index of random vectors saved once (the base), then per round 200 vectors added and
saved both ways, timed (median of `--rounds`; the rewrite forced with `needs_full_save`, each into its
own file, interleaved). Bytes are what the save wrote (the file's size, or the log's growth).
`--dir` puts the files on the disk to measure (default: a temp dir).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from indexer.storage.vectors.faiss.delta import delta_path  # noqa: E402
from indexer.storage.vectors.faiss.index import VectorIndex  # noqa: E402
from indexer.storage.vectors.faiss.saving import IndexFiles  # noqa: E402

ADDED = 200


def _unit(n: int, dim: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _built(size: int, dim: int) -> VectorIndex:
    index = VectorIndex(dim, "Flat", "bench")
    for start in range(0, size, 50_000):
        count = min(50_000, size - start)
        index.add(np.arange(start, start + count), _unit(count, dim, start))
    return index


def measure(size: int, dim: int, rounds: int, folder: Path) -> dict[str, float]:
    index = _built(size, dim)
    paths = {"append": folder / f"append-{size}.faiss", "rewrite": folder / f"rewrite-{size}.faiss"}
    files = {"append": index.files, "rewrite": IndexFiles(dim)}  # one index, two sets of files
    for how in files:
        index.files = files[how]
        index.save(paths[how])
    times: dict[str, list[float]] = {"append": [], "rewrite": []}
    written = {"append": 0, "rewrite": 0}
    for turn in range(rounds):
        index.files = files["append"]  # what the append will write is tracked there
        index.add(np.arange(size + turn * ADDED, size + (turn + 1) * ADDED), _unit(ADDED, dim, size + turn))
        for how in ("append", "rewrite") if turn % 2 == 0 else ("rewrite", "append"):
            index.files = files[how]
            if how == "rewrite":
                index.needs_full_save = True
            log = delta_path(paths[how])
            before = log.stat().st_size if log.exists() else 0
            started = time.perf_counter()
            index.save(paths[how])
            times[how].append(time.perf_counter() - started)
            after = log.stat().st_size if log.exists() else 0
            written[how] = paths[how].stat().st_size if how == "rewrite" else after - before
    started = time.perf_counter()
    loaded = VectorIndex.load(paths["append"], dim, "Flat", "bench")
    opened = time.perf_counter() - started
    assert loaded.ntotal == index.ntotal, (loaded.ntotal, index.ntotal)
    return {
        "append_ms": 1000 * statistics.median(times["append"]),
        "rewrite_ms": 1000 * statistics.median(times["rewrite"]),
        "append_bytes": written["append"],
        "rewrite_bytes": written["rewrite"],
        "open_s": opened,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,300000")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    print(f"| vectors | +{ADDED} saved: append | bytes | whole rewrite | bytes | open (base + log) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            r = measure(size, args.dim, args.rounds, Path(folder))
        print(
            f"| {size:,} | {r['append_ms']:.1f} ms | {r['append_bytes'] / 1024:,.0f} KiB "
            f"| {r['rewrite_ms']:.0f} ms | {r['rewrite_bytes'] / 2**20:,.0f} MiB | {r['open_s']:.2f} s |",
            flush=True,
        )


if __name__ == "__main__":
    main()
