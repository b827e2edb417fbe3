"""Bulk indexing throughput against the encoder's own throughput on the same images, same machine.

    python benchmarks/bench_indexing.py --model-dir DIR --images 200 --width 1024 --height 768 --batch-size 32

Every side starts the encoder once, before the clock, and embeds the same generated JPEGs in batches
of `--batch-size`, all batches queued at once:
- "encoder" embeds the files' bytes already in memory (the encoder decodes them: what `cnclip index`
  must at least reach, issue 34 asks ≥ 0.9× of it);
- "pixels" embeds the same images decoded before the clock (the model alone: what decoding costs
  shows as the gap between the two);
- "pipeline" is `cnclip index`'s code path on a fresh SQLite catalog: walk, read, sha256, probe,
  perceptual hash, decode, embed, commit rows + vectors, FAISS add, final atomic save; its stage
  times (docs/indexing.md) are printed per round;
- with `--bytes-pipeline`, also the pipeline handing the encoder bytes (as before issue 34).
Rounds interleave the sides (their order rotates each round); each side's median (min–max) and the
ratios of medians are the numbers to read. On a machine shared with other work they are noise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from PIL import Image

from api.config import Settings
from indexer.bulk import pipeline as bulk_pipeline
from indexer.bulk.pipeline import ImageIndexer
from indexer.runtime import open_runtime
from retrieval.encoder import LocalEncoder, create_encoder
from retrieval.types import Encoder


def generate_jpegs(folder: Path, count: int, size: tuple[int, int]) -> None:
    """Photo-sized JPEGs: smooth gradients plus noise, so decoding costs what a photo costs."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    width, height = size
    ys, xs = np.mgrid[0:height, 0:width]
    for i in range(count):
        base = np.stack([(xs * (i % 7 + 1)) % 256, (ys * (i % 5 + 1)) % 256, ((xs + ys) * (i % 3 + 1)) % 256], axis=-1)
        noisy = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(noisy).save(buffer, "JPEG", quality=88)
        (folder / f"{i:05d}.jpg").write_bytes(buffer.getvalue())


async def standalone(encoder: Encoder, images: list[bytes], batch: int) -> float:
    started = time.perf_counter()
    await asyncio.gather(*(encoder.embed_images(images[s : s + batch]) for s in range(0, len(images), batch)))
    return len(images) / (time.perf_counter() - started)


async def model_alone(encoder: Encoder, pixels: np.ndarray, batch: int) -> float:
    started = time.perf_counter()
    await asyncio.gather(*(encoder.embed_pixels(pixels[s : s + batch]) for s in range(0, len(pixels), batch)))
    return len(pixels) / (time.perf_counter() - started)


async def pipeline(
    settings: Settings, encoder: Encoder, folder: Path, data_dir: Path, *, decode: bool = True
) -> tuple[float, dict[str, float]]:
    """Images/s of a fresh `cnclip index` run and its stage times; `decode=False`: the encoder gets bytes."""
    shutil.rmtree(data_dir, ignore_errors=True)
    fresh = settings.model_copy(update={"data_dir": data_dir, "database_url": None})
    async with open_runtime(fresh, encoder=encoder) as rt:
        assert rt.service is not None
        indexer = ImageIndexer.from_settings(settings, rt.service, "bench")
        with _decoding(decode):
            started = time.perf_counter()
            summary = await indexer.run(folder)
            elapsed = time.perf_counter() - started
        assert summary.added == len(list(folder.iterdir())), summary
        return summary.added / elapsed, summary.stages.rounded()


@contextlib.contextmanager
def _decoding(on: bool) -> Iterator[None]:
    """The pipeline as it runs (decoding in its reader threads), or handing the encoder bytes."""
    if on:
        yield
        return
    original = bulk_pipeline.pixel_decoder
    bulk_pipeline.pixel_decoder = lambda encoder, clock: None  # type: ignore[assignment]
    try:
        yield
    finally:
        bulk_pipeline.pixel_decoder = original


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


async def run(args: argparse.Namespace) -> dict[str, object]:
    settings = Settings(model_dir=args.model_dir, index_batch_size=args.batch_size)
    work = Path(tempfile.mkdtemp(prefix="cnclip-bench-index-"))
    folder = work / "images"
    generate_jpegs(folder, args.images, (args.width, args.height))
    images = [p.read_bytes() for p in sorted(folder.iterdir())]
    encoder = create_encoder(settings)
    await encoder.start()
    rates: dict[str, list[float]] = {"encoder": [], "pixels": [], "pipeline": []}
    if args.bytes_pipeline:
        rates["pipeline_bytes"] = []
    stages: list[dict[str, float]] = []
    cpu_ms: dict[str, list[float]] = {side: [] for side in rates}  # this process's CPU per image: less noisy
    load_before = os.getloadavg()[0]
    try:
        assert isinstance(encoder, LocalEncoder), "the pixels side needs the local encoder"
        decode = encoder.image_preprocessor()
        pixels = np.stack([decode(data) for data in images])  # before the clock
        await encoder.embed_images(images[: args.batch_size])  # warm caches outside the clock
        sides = {
            "encoder": lambda: standalone(encoder, images, args.batch_size),
            "pixels": lambda: model_alone(encoder, pixels, args.batch_size),
            "pipeline": lambda: _piped(settings, encoder, folder, work / "data", stages, decode=True),
            "pipeline_bytes": lambda: _piped(settings, encoder, folder, work / "data", [], decode=False),
        }
        order = list(rates)
        for round_ in range(args.rounds):
            for side in order[round_ % len(order) :] + order[: round_ % len(order)]:  # rotated each round
                cpu = time.process_time()
                rates[side].append(await sides[side]())
                cpu_ms[side].append((time.process_time() - cpu) * 1000 / len(images))
            line = ", ".join(f"{side} {rates[side][-1]:.1f} ({cpu_ms[side][-1]:.0f} cpu ms)" for side in order)
            print(f"round {round_ + 1} (img/s): {line}; pipeline stages (s) {stages[-1]}", flush=True)
    finally:
        await encoder.close()
        shutil.rmtree(work, ignore_errors=True)
    medians = {side: statistics.median(values) for side, values in rates.items()}
    return {
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "model": encoder.model_id,
        "images": args.images,
        "size": f"{args.width}x{args.height}",
        "batch": args.batch_size,
        "rounds": args.rounds,
        "img_s": {side: _spread(values) for side, values in rates.items()},
        "cpu_ms_per_image": {side: _spread(values) for side, values in cpu_ms.items()},
        # pipeline / encoder is the number (≥ 0.9); / pixels says what decoding costs on top.
        "ratio": round(medians["pipeline"] / medians["encoder"], 3),
        "ratio_to_pixels": round(medians["pipeline"] / medians["pixels"], 3),
        **({"ratio_bytes": round(medians["pipeline_bytes"] / medians["encoder"], 3)} if args.bytes_pipeline else {}),
        "stages_median": {key: round(statistics.median(s[key] for s in stages), 3) for key in stages[0]},
    }


async def _piped(
    settings: Settings, encoder: Encoder, folder: Path, data: Path, stages: list[dict[str, float]], *, decode: bool
) -> float:
    rate, times = await pipeline(settings, encoder, folder, data, decode=decode)
    stages.append(times)
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--bytes-pipeline", action="store_true", help="also the pipeline handing the encoder bytes")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), ensure_ascii=False))


if __name__ == "__main__":
    main()
