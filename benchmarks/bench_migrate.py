"""Model migration: throughput of the shadow fill (items/s) and search latency during it vs idle.

    python benchmarks/bench_migrate.py --smoke              # 200 items, a few seconds
    python benchmarks/bench_migrate.py --items 5000

Deterministic fake encoders (retrieval/fake.py) stand in for the models, so the numbers are the
catalog's and the job's cost (SQL reads and writes, the probe, building the new generation's store,
the swap), not a model's; a real model's embedding time adds to the fill. Searches run in a loop
through the service, the way a server's requests do, while `cnclip migrate`'s job runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from indexer.domain.paging import PageRequest  # noqa: E402
from indexer.domain.records import NewImage  # noqa: E402
from indexer.runtime import open_catalog  # noqa: E402
from indexer.service.collections import CollectionService  # noqa: E402
from indexer.service.migration import MigrateOptions  # noqa: E402
from retrieval.fake import FakeEncoder  # noqa: E402


async def _searches(service: CollectionService, stop: asyncio.Event, latencies: list[float]) -> None:
    n = 0
    while not stop.is_set():
        started = time.perf_counter()
        await service.search.text(f"查询 {n}", "bench", PageRequest(k=10))
        latencies.append((time.perf_counter() - started) * 1000)
        n += 1
        await asyncio.sleep(0.001)


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 2 else (values[0] if values else 0.0)


async def run(items: int, idle_s: float) -> dict[str, float]:
    from api.config import Settings

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(_env_file=None, data_dir=Path(tmp), database_url=f"sqlite:///{tmp}/c.db")
        catalog = open_catalog(settings)
        old, new = FakeEncoder(dim=64), FakeEncoder(dim=64, model_id="fake-next")
        await old.start()
        await new.start()
        service = CollectionService(catalog, old, encoders=[new])
        service.create("bench", "images")
        for start in range(0, items, 500):
            batch = [NewImage(data=f"image {i}".encode(), mime="image/jpeg", width=1, height=1)
                     for i in range(start, min(items, start + 500))]  # fmt: skip
            service.writes.add_images("bench", batch, old.embed_images_sync([b.data for b in batch]))
        idle: list[float] = []
        stop = asyncio.Event()
        task = asyncio.create_task(_searches(service, stop, idle))
        await asyncio.sleep(idle_s)
        stop.set()
        await task
        during: list[float] = []
        stop = asyncio.Event()
        task = asyncio.create_task(_searches(service, stop, during))
        report = await service.migration.migrate("bench", new, MigrateOptions(batch=64, prune_missing=True))
        stop.set()
        await task
        catalog.close()
    return {
        "items": items,
        "items_per_s": round(report.items_per_s, 1),
        "migrate_s": round(report.seconds, 2),
        "swapped": float(report.swapped),
        "search_idle_p50_ms": round(_p(idle, 50), 2),
        "search_during_p50_ms": round(_p(during, 50), 2),
        "search_during_p95_ms": round(_p(during, 95), 2),
        "searches_during": len(during),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--smoke", action="store_true", help="200 items, a short idle phase")
    args = parser.parse_args()
    items, idle_s = (200, 0.5) if args.smoke else (args.items, 3.0)
    for key, value in asyncio.run(run(items, idle_s)).items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
