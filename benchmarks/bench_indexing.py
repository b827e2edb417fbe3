"""Bulk indexing throughput against the encoder's own throughput on the same images, same machine.

    python benchmarks/bench_indexing.py --model-dir /work/bench-models/vit-b-16 --images 1000 --rounds 3

Both sides start the encoder once, before the clock. "standalone" embeds the images already in
memory, all batches queued at once (the encoder's best case). "pipeline" is `cnclip index`'s code
path on a fresh SQLite catalog: walk, read, sha256, probe, embed, commit rows + vectors, FAISS add,
final atomic save. Rounds alternate the two; the ratio of medians is the number to read.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import platform
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from PIL import Image

from api.config import Settings
from indexer.bulk.pipeline import ImageIndexer
from indexer.runtime import open_runtime
from retrieval.encoder import create_encoder
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


async def pipeline(settings: Settings, encoder: Encoder, folder: Path, data_dir: Path) -> float:
    shutil.rmtree(data_dir, ignore_errors=True)
    fresh = settings.model_copy(update={"data_dir": data_dir, "database_url": None})
    async with open_runtime(fresh, encoder=encoder) as rt:
        assert rt.service is not None
        indexer = ImageIndexer.from_settings(settings, rt.service, "bench")
        started = time.perf_counter()
        summary = await indexer.run(folder)
        elapsed = time.perf_counter() - started
        assert summary.added == len(list(folder.iterdir())), summary
        return summary.added / elapsed


async def run(args: argparse.Namespace) -> dict[str, object]:
    settings = Settings(model_dir=args.model_dir, index_batch_size=args.batch_size)
    work = Path(tempfile.mkdtemp(prefix="cnclip-bench-index-"))
    folder = work / "images"
    generate_jpegs(folder, args.images, (args.width, args.height))
    images = [p.read_bytes() for p in sorted(folder.iterdir())]
    encoder = create_encoder(settings)
    await encoder.start()
    try:
        await encoder.embed_images(images[: args.batch_size])  # warm caches outside the clock
        alone, piped = [], []
        for round_ in range(args.rounds):
            alone.append(await standalone(encoder, images, args.batch_size))
            piped.append(await pipeline(settings, encoder, folder, work / "data"))
            print(f"round {round_ + 1}: standalone {alone[-1]:.1f} img/s, pipeline {piped[-1]:.1f} img/s", flush=True)
    finally:
        await encoder.close()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "machine": platform.machine(),
        "model": encoder.model_id,
        "images": args.images,
        "size": f"{args.width}x{args.height}",
        "batch": args.batch_size,
        "rounds": args.rounds,
        "standalone_img_s": round(statistics.median(alone), 2),
        "pipeline_img_s": round(statistics.median(piped), 2),
        "ratio": round(statistics.median(piped) / statistics.median(alone), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), ensure_ascii=False))


if __name__ == "__main__":
    main()
