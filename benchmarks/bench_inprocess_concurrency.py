"""Throughput of the local encoder at concurrency 1, 2, 4, 8, in this process (no HTTP).

    python benchmarks/bench_inprocess_concurrency.py [--seconds 3] [--concurrency 1,2,4,8] [--towers text,image]
        [--buckets 1,4,8,16,32] [--model-dir DIR] [--streams N] [--threads-per-stream N]

For each tower and concurrency, `c` clients each send one request after another for `--seconds`
(texts all different, so the query cache never answers; images: a 1024×768 JPEG photo-like picture,
decoded and resized on the server side as a `/v2` bytes request is). Prints one line per cell:
requests/s; requests per CPU-second of this process (what oversubscription and spinning waste
shows there even on a busy machine); p50 latency; the batches the batcher ran (bucket: count, rows
per batch); and the most threads seen runnable at once in /proc/self/task (R state, this sampler
excluded) against the cores. Requests/s and latency depend on what else runs on the machine: on a
shared one they are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import resource
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from retrieval.config import SHIPPED_MODEL_DIR, RuntimeSettings  # noqa: E402
from retrieval.encoder import LocalEncoder  # noqa: E402
from retrieval.machine_limits import runnable_threads, usable_cores  # noqa: E402


class BatchLog:
    """The encoder observer: counts batches by bucket and their real rows."""

    def __init__(self) -> None:
        self.batches: Counter[tuple[str, int]] = Counter()
        self.rows: Counter[tuple[str, int]] = Counter()

    def batch_done(self, tower: str, bucket: int, rows: int, timings: dict[str, float]) -> None:
        self.batches[(tower, bucket)] += 1
        self.rows[(tower, bucket)] += rows

    def words(self, tower: str) -> str:
        keys = sorted(k for k in self.batches if k[0] == tower)
        return " ".join(
            f"b{b}:{self.batches[(tower, b)]}({self.rows[(tower, b)] / self.batches[(tower, b)]:.1f})" for _, b in keys
        )


class RunnableSampler:
    """The most threads of this process in R state at once, sampled every ~2 ms in its own thread."""

    def __init__(self) -> None:
        self.peak = 0
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = threading.get_native_id()
        while not self._stop.is_set():
            self.samples.append(runnable_threads(exclude={me}))
            time.sleep(0.002)

    def __enter__(self) -> RunnableSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.samples, default=0)


def process_cpu_seconds() -> float:
    """CPU time this process has used, all threads (spinning and oversubscribed threads show here,
    and it does not depend on how much of the machine other processes take)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def photo_jpeg(width: int = 1024, height: int = 768, seed: int = 0) -> bytes:
    """A photo-like JPEG: smooth gradients plus mild noise (a real photo's size and decode cost)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], axis=-1)
    pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


async def one_cell(encoder: LocalEncoder, tower: str, concurrency: int, seconds: float, photo: bytes) -> list[float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**9))

    async def client() -> None:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            if tower == "text":
                await encoder.embed_texts([f"一只猫在草地上 第{next(counter)}张"])
            else:
                await encoder.embed_images([photo])
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--towers", default="text,image")
    parser.add_argument("--buckets", default="", help="CNCLIP_BUCKETS for this run (default: the settings')")
    parser.add_argument("--model-dir", type=Path, default=SHIPPED_MODEL_DIR)
    parser.add_argument("--streams", type=int, default=1, help="CNCLIP_STREAMS")
    parser.add_argument("--threads-per-stream", type=int, default=0, help="CNCLIP_THREADS_PER_STREAM")
    args = parser.parse_args()
    overrides: dict[str, Any] = {
        "provider": "cpu",
        "model_dir": args.model_dir,
        "query_cache_size": 0,
        "streams": args.streams,
        "threads_per_stream": args.threads_per_stream,
    }
    if args.buckets:
        overrides["buckets"] = [int(b) for b in args.buckets.split(",")]
    log = BatchLog()
    encoder = LocalEncoder(RuntimeSettings(_env_file=None, **overrides), observer=log)
    await encoder.start()
    photo = photo_jpeg()
    print(
        f"# {args.model_dir.name}, buckets text {encoder.buckets['text']} image {encoder.buckets['image']}, "
        f"{args.streams} stream(s) × {args.threads_per_stream or 'all'} threads, "
        f"{usable_cores()} cores, load {os.getloadavg()[0]:.2f} at start (shared machine: noisy)"
    )
    print(
        "tower | concurrency | req/s | req per CPU-s | p50 ms | batches bucket:count(rows per batch) | "
        "most runnable threads"
    )
    try:
        for tower in args.towers.split(","):
            await one_cell(encoder, tower, 1, min(1.0, args.seconds), photo)  # warm
            for concurrency in [int(c) for c in args.concurrency.split(",")]:
                log.batches.clear()
                log.rows.clear()
                cpu_before = process_cpu_seconds()
                with RunnableSampler() as sampler:
                    latencies = await one_cell(encoder, tower, concurrency, args.seconds, photo)
                cpu = process_cpu_seconds() - cpu_before
                print(
                    f"{tower} | {concurrency} | {len(latencies) / args.seconds:.1f} | "
                    f"{len(latencies) / max(cpu, 1e-9):.1f} | {statistics.median(latencies) * 1000:.1f} | "
                    f"{log.words(tower)} | {sampler.peak}"
                )
    finally:
        await encoder.close()


if __name__ == "__main__":
    asyncio.run(main())
