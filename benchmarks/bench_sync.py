"""What "many processes, one truth" costs a search: the version check on an unchanged collection,
and how soon a change committed by another catalog (another process) is searchable.

    python benchmarks/bench_sync.py                  # SQLite and PostgreSQL (127.0.0.1:5432, database test)
    python benchmarks/bench_sync.py --no-postgres    # SQLite only

For each database: a collection of `--items` random 512-d vectors (Flat). `check` = one call of
`SqlCatalog.store(name)` with `sync_interval_s=0`, i.e. the indexed `SELECT` of the collection's
row that every search would make if it checked each time (the default checks at most every 0.5 s,
so most searches make none). `search` = the whole catalog search with the check forced and with it
off (`sync_interval_s=60`), interleaved in rounds. `visible` = from another catalog's commit of
one item to the first search (polling every 5 ms) that returns it, with the default interval.
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

from api.config import Settings  # noqa: E402
from indexer.domain.records import NewText  # noqa: E402
from indexer.runtime import open_catalog  # noqa: E402

DIM = 512


def unit(n: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def catalog(data_dir: Path, url: str, interval: float):  # type: ignore[no-untyped-def]
    return open_catalog(Settings(_env_file=None, data_dir=data_dir, database_url=url, sync_interval_s=interval))


def timed_us(call, repeat: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        out.append((time.perf_counter() - started) * 1e6)
    return out


def run(url: str, items: int, rounds: int, repeat: int) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        writer = catalog(root / "writer", url, 0.5)
        writer.create_collection("bench", "texts", "bench", DIM)
        for start in range(0, items, 5000):
            n = min(5000, items - start)
            writer.add_texts("bench", [NewText(f"t{start + i}") for i in range(n)], unit(n, start))
        forced = catalog(root / "forced", url, 0.0)
        relaxed = catalog(root / "relaxed", url, 60.0)
        query = unit(1, 999)[0]
        checks: list[float] = []
        with_check: list[float] = []
        without: list[float] = []
        for _ in range(rounds):  # interleaved
            checks += timed_us(lambda: forced.store("bench"), repeat)
            with_check += timed_us(lambda: forced.search("bench", query, 10), repeat // 10)
            without += timed_us(lambda: relaxed.search("bench", query, 10), repeat // 10)
        default = catalog(root / "default", url, 0.5)
        default.search("bench", query, 1)
        visible = []
        for i in range(5):
            vector = unit(1, 10_000 + i)
            writer.add_texts("bench", [NewText(f"new {i}")], vector)
            committed = time.perf_counter()
            while default.search("bench", vector[0], 1)[0].score < 0.999:
                time.sleep(0.005)
            visible.append((time.perf_counter() - committed) * 1000)
            time.sleep(0.6)  # the next change finds a fresh interval
        for c in (writer, forced, relaxed, default):
            c.close()

    def stats(values: list[float]) -> str:
        q = statistics.quantiles(values, n=100)
        return f"{statistics.median(values):.0f} (p99 {q[98]:.0f})"

    return {
        "check_us": stats(checks),
        "search_with_check_us": stats(with_check),
        "search_without_check_us": stats(without),
        "visible_ms": f"{statistics.median(visible):.0f} (max {max(visible):.0f})",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=400)
    parser.add_argument("--postgres", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    databases = ["SQLite", "PostgreSQL"] if args.postgres else ["SQLite"]
    print(
        "| database | version check µs, median (p99) | search µs with the check | search µs without | another process's add searchable after, ms median (max) |"
    )
    print("| --- | --- | --- | --- | --- |")
    for name in databases:
        if name == "SQLite":
            with tempfile.TemporaryDirectory() as tmp:
                result = run(f"sqlite:///{tmp}/bench.db", args.items, args.rounds, args.repeat)
        else:
            from tests.support.postgres import fresh_schema

            with fresh_schema() as schema_url:
                result = run(schema_url, args.items, args.rounds, args.repeat)
        print(
            f"| {name} | {result['check_us']} | {result['search_with_check_us']} | "
            f"{result['search_without_check_us']} | {result['visible_ms']} |"
        )


if __name__ == "__main__":
    main()
