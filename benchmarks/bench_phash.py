"""What a new photo's perceptual hash costs, and how far hash versions 1 and 2 lie apart.

    python benchmarks/bench_phash.py [--rounds 5] [--pictures 200]

Per photo (photo-like JPEGs, quality 90, 1024×768 and 4032×3024), ms, interleaved rounds, median
(min–max) of each round's mean:
- "pixels": the encoder's preprocessing alone (decode + normalise: what `cnclip index` always pays);
- "pixels + hash": the same decode giving the hash too (version 2: indexer/bulk/reading.py `pixels_and_hash`);
- "v1 hash": version 1's hash on its own (a JPEG decoded at 1/8 scale): what each new photo cost on
  top of "pixels" before revision 0009;
- "v2 hash of bytes": `phash_of_bytes` (a full-scale decode): backfills and a remote encoder's runs.
Then the Hamming distance between the two versions' hashes of the same picture, for `--pictures`
photo-like JPEGs of random sizes (150–2600 px a side) and qualities (60–96); and each version's
distances between a picture and its edits, and between distinct pictures (demo/duplicate_threshold.py's
measure, 100 photo-like pictures and 100 of the demo gallery).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine  # noqa: E402
from demo import dataset  # noqa: E402
from demo.duplicate_threshold import encoded, hash_distances, photo_like  # noqa: E402
from indexer.bulk.reading import pixels_and_hash  # noqa: E402
from indexer.domain.perceptual import HASH_SIDE, hamming, phash_of_bytes, phash_or_none  # noqa: E402
from retrieval.preprocess import ImagePreprocessor, decode_image  # noqa: E402

SIZES = ((1024, 768), (4032, 3024))


def version_1(data: bytes) -> int | None:
    """Version 1's hash: a JPEG decoded at a reduced scale (Pillow's draft, ≥ 64 px), greyscale, a box
    reduction by any factor to 64–127 px (version 2: by a power of two), then the same steps."""
    grey = decode_image(data, draft=2 * HASH_SIDE).convert("L")
    if min(grey.size) >= 4 * HASH_SIDE:
        grey = grey.reduce(min(grey.size) // (2 * HASH_SIDE))
    return phash_or_none(grey)  # under 128 px: no further reduction


def costs(rounds: int) -> None:
    preprocess = ImagePreprocessor()
    for size in SIZES:
        data = encoded(photo_like(1, size), quality=90)
        sides: dict[str, Callable[[], object]] = {
            "pixels": functools.partial(preprocess, data),
            "pixels + hash": functools.partial(pixels_and_hash, preprocess, data),
            "v1 hash": functools.partial(version_1, data),
            "v2 hash of bytes": functools.partial(phash_of_bytes, data),
        }
        calls = 20 if size[0] < 2000 else 3
        times: dict[str, list[float]] = {side: [] for side in sides}
        for round_ in range(rounds):
            order = list(sides)
            for side in order[round_ % len(order) :] + order[: round_ % len(order)]:
                sides[side]()  # warm
                started = time.perf_counter()
                for _ in range(calls):
                    sides[side]()
                times[side].append((time.perf_counter() - started) / calls * 1000)
        line = ", ".join(f"{side} {statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f})" for side, v in times.items())
        print(f"{size[0]}×{size[1]} ms per photo: {line}", flush=True)


def agreement(pictures: int) -> None:
    rng = np.random.default_rng(7)
    distances = []
    for seed in range(pictures):
        width, height = (int(x) for x in rng.integers(150, 2600, 2))
        data = encoded(photo_like(seed, (width, height)), quality=int(rng.integers(60, 97)))
        one, two = version_1(data), phash_of_bytes(data)
        distances.append(int(hamming(np.array([one]), np.array([two]))[0]))
    counts = np.bincount(distances)
    spread = ", ".join(f"{bits} bits: {n}" for bits, n in enumerate(counts) if n)
    print(f"version 1 vs 2 of the same picture, {pictures} photo-like JPEGs: {spread}")


def quality() -> None:
    photos = [photo_like(seed) for seed in range(100)]
    gallery = [scene.image() for scene in dataset.demo_gallery(100)]
    for name, phash in (("version 1", version_1), ("version 2", phash_of_bytes)):
        measured = {"photo-like": hash_distances(photos, phash), "demo gallery": hash_distances(gallery, phash)}
        print(f"{name}: {json.dumps(measured)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pictures", type=int, default=200)
    args = parser.parse_args()
    print(machine(), flush=True)
    costs(args.rounds)
    agreement(args.pictures)
    quality()


if __name__ == "__main__":
    main()
