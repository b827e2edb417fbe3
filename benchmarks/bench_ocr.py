"""Text in photos (docs/ocr.md): OCR throughput, and the indexing rate with OCR on vs off, in one run.

    python benchmarks/bench_ocr.py --smoke                     # 6 photos, the toy model: a quick check
    python benchmarks/bench_ocr.py --model-dir DIR -n 48       # a real model, photo-sized pictures

Pictures: the rendered Chinese signs and screenshots of the tests (tests/support/ocr_pictures.py), scaled
to `--width`×`--height` (1280×960 by default) and saved as JPEGs, every other one a demo-gallery picture
without text (what a photo folder holds).

1. OCR alone: `OcrReader.read_many` over all the pictures with CNCLIP_OCR_THREADS (`--threads`) at once:
   photos/s, and one photo at a time on one thread (the latency of one photo).
2. `cnclip index`'s pipeline (indexer/bulk/pipeline.py) into a fresh collection with OCR off and with OCR
   on, interleaved (off, on, on, off, …) over `--rounds` rounds so that the machine's drift hits both:
   images/s of each, medians. The encoder is loaded once, outside the clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.config import Settings  # noqa: E402
from benchmarks.peak import cpu_flags  # noqa: E402
from indexer.bulk.pipeline import ImageIndexer  # noqa: E402
from indexer.runtime import open_runtime  # noqa: E402
from retrieval.encoder import create_encoder  # noqa: E402
from retrieval.ocr.engine import rapidocr_version  # noqa: E402
from retrieval.ocr.reader import OcrReader  # noqa: E402
from retrieval.types import Encoder  # noqa: E402
from tests.support.ocr_pictures import PICTURES, render_text_picture  # noqa: E402


def write_pictures(folder: Path, count: int, size: tuple[int, int]) -> None:
    from demo.dataset import demo_gallery

    folder.mkdir(parents=True, exist_ok=True)
    plain = demo_gallery(count // 2 + 1, seed=5)
    for i in range(count):
        if i % 2 == 0:
            image = render_text_picture(PICTURES[(i // 2) % len(PICTURES)], seed=i)
        else:
            image = plain[i // 2].image().convert("RGB")
        image.resize(size).save(folder / f"{i:04d}.jpg", "JPEG", quality=88)


async def ocr_alone(images: list[bytes], threads: int) -> dict[str, float]:
    reader = OcrReader(threads=threads)
    single = OcrReader(threads=1)
    try:
        reader.engine()
        single.engine()
        await reader.read_many(images[:threads])  # warm up outside the clock
        started = time.perf_counter()
        found = await reader.read_many(images)
        wall = time.perf_counter() - started
        assert found is not None
        one = []
        for data in images[: min(6, len(images))]:
            started = time.perf_counter()
            single.read(data)
            one.append(time.perf_counter() - started)
    finally:
        reader.close()
        single.close()
    return {
        "photos_per_s": round(len(images) / wall, 3),
        "one_photo_s_median": round(statistics.median(one), 3),
        "with_text": sum(1 for text in found if text.text),
    }


async def index_once(settings: Settings, encoder: Encoder, folder: Path, data_dir: Path, ocr: bool) -> float:
    shutil.rmtree(data_dir, ignore_errors=True)
    fresh = settings.model_copy(update={"data_dir": data_dir, "database_url": None})
    async with open_runtime(fresh, encoder=encoder) as rt:
        assert rt.service is not None
        rt.service.create("bench", "images")
        if ocr:
            rt.service.texts.set_ocr("bench", True)
            await asyncio.to_thread(rt.service.texts.reader.engine)  # type: ignore[union-attr]  # loaded outside the clock
        indexer = ImageIndexer.from_settings(fresh, rt.service, "bench")
        started = time.perf_counter()
        summary = await indexer.run(folder)
        elapsed = time.perf_counter() - started
        count = len(list(folder.iterdir()))
        assert summary.added == count and summary.read_for_text == (count if ocr else 0), summary
        return summary.added / elapsed


async def run(args: argparse.Namespace) -> dict[str, object]:
    settings = Settings(
        _env_file=None, model_dir=args.model_dir, index_batch_size=args.batch_size, ocr_threads=args.threads
    )
    work = Path(tempfile.mkdtemp(prefix="cnclip-bench-ocr-"))
    folder = work / "pictures"
    write_pictures(folder, args.n, (args.width, args.height))
    images = [p.read_bytes() for p in sorted(folder.iterdir())]
    alone = await ocr_alone(images, args.threads)
    print(f"OCR alone: {alone}", flush=True)
    encoder = create_encoder(settings)
    await encoder.start()
    rates: dict[str, list[float]] = {"off": [], "on": []}
    try:
        await encoder.embed_images(images[: args.batch_size])  # warm caches outside the clock
        for round_ in range(args.rounds):
            order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
            for mode in order:
                rate = await index_once(settings, encoder, folder, work / f"data-{mode}", mode == "on")
                rates[mode].append(rate)
                print(f"round {round_ + 1}: OCR {mode}: {rate:.2f} images/s", flush=True)
    finally:
        await encoder.close()
        shutil.rmtree(work, ignore_errors=True)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    return {
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "machine": platform.machine(),
        "cores": len(os.sched_getaffinity(0)),
        "cpu_flags": cpu_flags(),
        "engine": f"rapidocr {rapidocr_version()}",
        "model": encoder.model_id,
        "pictures": args.n,
        "size": f"{args.width}x{args.height}",
        "ocr_threads": args.threads,
        "streams": settings.streams,
        "rounds": args.rounds,
        "ocr_alone": alone,
        "index_img_s_ocr_off": round(off, 3),
        "index_img_s_ocr_on": round(on, 3),
        "ratio_on_off": round(on / off, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=None, help="Default: the shipped demo model.")
    parser.add_argument("-n", type=int, default=48, help="Pictures (half with text).")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="CNCLIP_OCR_THREADS.")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=960)
    parser.add_argument("--smoke", action="store_true", help="6 pictures of 640×480, one round, the toy model.")
    args = parser.parse_args()
    if args.smoke:
        from retrieval.toolchain.toy_model import write_toy_model

        toy = Path(tempfile.mkdtemp(prefix="cnclip-bench-ocr-toy-"))
        write_toy_model(toy)
        args.model_dir, args.n, args.rounds, args.width, args.height = toy, 6, 1, 640, 480
    if args.model_dir is None:
        from retrieval.config import SHIPPED_MODEL_DIR

        args.model_dir = SHIPPED_MODEL_DIR
    print(json.dumps(asyncio.run(run(args)), ensure_ascii=False))


if __name__ == "__main__":
    main()
