"""Decode time per photo format through the one decoder (retrieval/preprocess.py `decode_image`):
JPEG, PNG, HEIC, AVIF, and a camera RAW by its embedded preview and by a half-size demosaic.

One interleaved run: every round decodes each format once, in turn, so a slower moment of the machine
touches every format alike; the median per format is printed. The pictures are made here (a 12-Mpx
photo-like gradient with noise, 4032×3024 like a phone's); the RAW is the tests' self-written DNG
(tests/support/photo_fixtures.py) with a 4032×3024 CFA and, for the preview case, a 4032×3024 JPEG preview.

    python3 benchmarks/bench_decode_formats.py [--rounds 5] [--width 4032 --height 3024]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from retrieval.preprocess import decode_image  # noqa: E402
from tests.support.photo_fixtures import avif_bytes, dng_bytes, heic_bytes  # noqa: E402


def photo(width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(0)
    x = np.linspace(0, 1, width, dtype=np.float32)[None, :]
    y = np.linspace(0, 1, height, dtype=np.float32)[:, None]
    rgb = np.stack([x * 200 + y * 30, y * 180 + 40 + x * 10, (1 - x) * 120 + y * 60], axis=2)
    rgb += rng.normal(0, 8, size=rgb.shape).astype(np.float32)
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))


def encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=4032)
    parser.add_argument("--height", type=int, default=3024)
    args = parser.parse_args()
    picture = photo(args.width, args.height)
    inputs = {
        "JPEG q90": encoded(picture, "JPEG", quality=90),
        "PNG": encoded(picture, "PNG", compress_level=6),
        "HEIC q70": heic_bytes(picture, quality=70),
        "AVIF q70": avif_bytes(picture, quality=70),
        "RAW (DNG) preview": dng_bytes(args.width, args.height, preview=picture),
        "RAW (DNG) demosaic": dng_bytes(args.width, args.height),
    }
    limit = 10 * max(len(v) for v in inputs.values())
    times: dict[str, list[float]] = {name: [] for name in inputs}
    for data in inputs.values():  # warm-up: libraries loaded, first-call costs paid
        decode_image(data, max_bytes=limit)
    for _ in range(args.rounds):
        for name, data in inputs.items():
            started = time.perf_counter()
            image = decode_image(data, max_bytes=limit)
            times[name].append(time.perf_counter() - started)
            del image
    print(f"decode_image, {args.width}×{args.height}, median [min–max] of {args.rounds} interleaved rounds")
    jpeg = statistics.median(next(iter(times.values())))
    for name, data in inputs.items():
        ms = [t * 1000 for t in times[name]]
        print(
            f"  {name:<20} {statistics.median(ms):8.1f} ms [{min(ms):.1f}–{max(ms):.1f}]"
            f"  {statistics.median(times[name]) / jpeg:5.2f}× the first  ({len(data) / 1e6:6.2f} MB)"
        )


if __name__ == "__main__":
    main()
