"""A perf-analyzer-style sweep of the local encoder: items/s and latency percentiles per concurrency.

`concurrency` clients each send one-item requests back to back for `duration_s`; the encoder runs
with a given number of streams and with the dynamic batcher on or off. Payloads are realistic:
short distinct Chinese/English queries, and 512×384 JPEG photos (decode + resize is part of the
measured latency, as in the service). `cnclip bench encoders` and `benchmarks/bench_encoders.py`
drive this module.
"""

from __future__ import annotations

import asyncio
import functools
import io
import multiprocessing
import random
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from retrieval.config import RuntimeSettings
from retrieval.encoder import LocalEncoder
from retrieval.manifest import ModelManifest

_WORDS = [
    "猫",
    "狗",
    "汽车",
    "女孩",
    "男孩",
    "海边",
    "日落",
    "山",
    "城市",
    "红色",
    "蓝色",
    "裙子",
    "自行车",
    "花",
    "雪",
    "夜景",
    "咖啡",
    "书",
    "桌子",
    "老人",
    "孩子",
    "火车",
    "飞机",
    "a",
    "red",
    "car",
    "dog",
    "on",
    "the",
    "beach",
]


@dataclass(frozen=True)
class SweepPoint:
    tower: str
    streams: int
    batching: bool
    concurrency: int
    items: int
    seconds: float
    items_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float

    def row(self) -> str:
        mode = "on" if self.batching else "off"
        return (
            f"| {self.tower} | {self.streams} | {mode} | {self.concurrency} | {self.items_per_s:.1f} "
            f"| {self.p50_ms:.1f} | {self.p95_ms:.1f} | {self.p99_ms:.1f} |"
        )


TABLE_HEADER = (
    "| tower | streams | batcher | concurrency | items/s | p50 ms | p95 ms | p99 ms |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- |"
)


def text_payloads(count: int = 512, seed: int = 0) -> list[str]:
    """Distinct short queries of 2–6 words, like search-box input (no two alike)."""
    rng = random.Random(seed)
    seen: dict[str, None] = {}
    while len(seen) < count:
        seen[" ".join(rng.choices(_WORDS, k=rng.randint(2, 6)))] = None
    return list(seen)


@functools.lru_cache(maxsize=4)
def image_payloads(count: int = 16, size: tuple[int, int] = (512, 384), seed: int = 0) -> tuple[bytes, ...]:
    """JPEG photos with smooth content plus noise (realistic decode cost)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        y, x = np.mgrid[0 : size[1], 0 : size[0]]
        base = np.stack([x % 256, y % 256, (x * y) % 256], axis=-1) + rng.integers(0, 60, (size[1], size[0], 3))
        buffer = io.BytesIO()
        Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=85)
        out.append(buffer.getvalue())
    return tuple(out)


def percentiles(latencies: Sequence[float]) -> tuple[float, float, float]:
    ms = np.asarray(latencies) * 1000.0
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return float(p50), float(p95), float(p99)


async def measure(
    encoder: LocalEncoder,
    tower: str,
    concurrency: int,
    duration_s: float,
    texts: Sequence[str],
    images: Sequence[bytes],
    min_requests: int = 2,
) -> tuple[int, float, list[float]]:
    """(items, seconds, per-request latencies) for `concurrency` closed-loop clients."""
    latencies: list[float] = []
    counter = 0
    deadline = time.perf_counter() + duration_s

    async def client(offset: int) -> None:
        nonlocal counter
        i = offset
        # Every client completes at least `min_requests`, so slow models still give real percentiles.
        while time.perf_counter() < deadline or i < offset + min_requests * concurrency:
            start = time.perf_counter()
            if tower == "text":
                await encoder.embed_texts([texts[i % len(texts)]])
            else:
                await encoder.embed_images([images[i % len(images)]])
            latencies.append(time.perf_counter() - start)
            counter += 1
            i += concurrency

    start = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return counter, time.perf_counter() - start, latencies


async def sweep_config(
    settings: RuntimeSettings,
    towers: Sequence[str],
    concurrencies: Sequence[int],
    duration_s: float,
    manifest: ModelManifest | None = None,
    on_point: Callable[[SweepPoint], None] | None = None,
    min_requests: int = 2,
) -> list[SweepPoint]:
    """One encoder configuration (streams, batching) over every tower and concurrency."""
    # The payloads repeat: with the query cache on, the text tower would measure lookups, not the model.
    encoder = LocalEncoder(settings.model_copy(update={"query_cache_size": 0}), manifest)
    await encoder.start()
    texts, images = text_payloads(), image_payloads()
    points = []
    try:
        for tower in towers:
            await measure(encoder, tower, 1, 0.0, texts, images, min_requests=2)  # settle caches/threads
            for concurrency in concurrencies:
                items, seconds, latencies = await measure(
                    encoder, tower, concurrency, duration_s, texts, images, min_requests
                )
                p50, p95, p99 = percentiles(latencies)
                point = SweepPoint(
                    tower, settings.streams, settings.dynamic_batching, concurrency, items, seconds,
                    items / seconds, p50, p95, p99,
                )  # fmt: skip
                points.append(point)
                if on_point is not None:
                    on_point(point)
    finally:
        await encoder.close()
    return points


def run_sweep(
    model_dir: Path,
    towers: Sequence[str] = ("text", "image"),
    concurrencies: Sequence[int] = (1, 2, 4, 8, 16),
    configs: Sequence[tuple[int, bool]] = ((1, True), (1, False), (2, True)),
    duration_s: float = 5.0,
    base: RuntimeSettings | None = None,
    on_point: Callable[[SweepPoint], None] | None = None,
    min_requests: int = 2,
    isolate: bool = False,
) -> list[SweepPoint]:
    """Every (streams, batching) config in `configs`; the rest of the settings from `base`.

    `on_point` sees each point as soon as it is measured (progress for long runs). With `isolate`,
    each config runs in a fresh process, which prints its own progress to stderr instead: a real-size model's sessions leave freed-but-fragmented
    memory behind, and several configs in one process can exhaust a small machine's RAM.
    """
    base = base or RuntimeSettings(_env_file=None, model_dir=model_dir)  # type: ignore[call-arg]
    points: list[SweepPoint] = []
    for streams, batching in configs:
        settings = base.model_copy(update={"model_dir": model_dir, "streams": streams, "dynamic_batching": batching})
        job = (settings, tuple(towers), tuple(concurrencies), duration_s, min_requests)
        if isolate:
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
                config_points = pool.submit(_sweep_and_print, *job).result()  # the child prints progress
        else:
            config_points = asyncio.run(sweep_config(*job[:4], min_requests=min_requests, on_point=on_point))
        points += config_points
    return points


def _sweep_and_print(
    settings: RuntimeSettings, towers: Sequence[str], concurrencies: Sequence[int], duration_s: float, min_requests: int
) -> list[SweepPoint]:
    """The body of an isolated config (runs in a child process); prints progress to stderr."""

    def show(point: SweepPoint) -> None:
        print(f"measured: {point.row()}", file=sys.stderr, flush=True)

    return asyncio.run(
        sweep_config(settings, towers, concurrencies, duration_s, min_requests=min_requests, on_point=show)
    )


def to_json(points: Sequence[SweepPoint]) -> list[dict]:
    return [asdict(p) for p in points]
