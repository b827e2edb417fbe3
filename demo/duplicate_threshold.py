"""Where "similar shots" start for the demo model, and how far apart "the same picture" hashes lie.

    python -m demo.duplicate_threshold [--scenes 300] [--json]

CLIP cosine (the similar-shots tier of `cnclip duplicates`): for each scene of the demo gallery,
- another shot of the same scene: the same attributes drawn again with another seed (placement within
  ±8 px, shade, texture scale): the pairs the tier should find;
- another scene: one attribute of the subject or the setting changed (shape, colour, background or
  texture), drawn with its own seed: the nearest pairs it should not find;
- reframed (size or position changed) and edits of one picture (a JPEG at quality 40, half size, a 10 %
  crop) are reported, not counted either way.
The threshold is the lowest cosine (0.01 steps) at which at most 5 % of the "another scene" pairs pass:
people complain of "duplicates" that are different pictures far more than of a few missed bursts.
Vectors come from the int8 graphs, what `cnclip serve` runs on a CPU (fp32 gives the same threshold:
`--precision fp32`).

Perceptual hash (the "re-encoded or resized" tier, indexer/domain/perceptual.py): the Hamming distance between
a picture and its edits (re-encoded as JPEG q40, WebP q60, PNG; resized to half, quarter, double), and
between distinct pictures, on photo-like pictures (1/f noise, the spectrum of natural photos) and on the
demo gallery (flat drawn shapes, the hash's weak case: distinct pictures can hash alike there, which is
why a pair must also pass the cosine threshold, see docs/duplicates.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import itertools
import json
import random
from collections.abc import Callable

import numpy as np
from PIL import Image

from demo import dataset, vocabulary
from demo.evaluate import OnnxTowers
from indexer.domain.perceptual import phash_of_bytes
from retrieval.config import SHIPPED_MODEL_DIR

OTHER_SHOT_SEED = 7_777_777
FALSE_POSITIVE_RATE = 0.05
SCENE_KEYS = ("shape", "colour", "background", "texture")  # what makes it another scene
FRAMING_KEYS = ("size", "position")  # what makes it a reframed shot of the same scene


def encoded(image: Image.Image, fmt: str = "JPEG", **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def decoded(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def photo_like(seed: int, size: tuple[int, int] = (480, 360)) -> Image.Image:
    """Noise with a 1/f amplitude spectrum per channel: the statistics of natural photos, no subject."""
    rng = np.random.default_rng(seed)
    fy = np.fft.fftfreq(size[1])[:, None]
    fx = np.fft.fftfreq(size[0])[None, :]
    falloff = np.hypot(fx, fy)
    falloff[0, 0] = 1.0
    channels = []
    for _ in range(3):
        spectrum = (rng.standard_normal(falloff.shape) + 1j * rng.standard_normal(falloff.shape)) / falloff
        field = np.real(np.fft.ifft2(spectrum))
        channels.append((field - field.min()) / (field.max() - field.min()) * 255)
    return Image.fromarray(np.stack(channels, axis=2).astype(np.uint8))


def crop(image: Image.Image, share: float) -> Image.Image:
    dx, dy = int(image.width * share / 2), int(image.height * share / 2)
    return image.crop((dx, dy, image.width - dx, image.height - dy))


EDITS: dict[str, Callable[[Image.Image], bytes]] = {
    "jpeg_q40": lambda im: encoded(im, quality=40),
    "webp_q60": lambda im: encoded(im, "WEBP", quality=60),
    "png": lambda im: encoded(im, "PNG"),
    "half": lambda im: encoded(im.resize((im.width // 2, im.height // 2), Image.Resampling.BICUBIC), quality=85),
    "quarter": lambda im: encoded(im.resize((im.width // 4, im.height // 4), Image.Resampling.BILINEAR), quality=85),
    "double": lambda im: encoded(im.resize((im.width * 2, im.height * 2), Image.Resampling.BICUBIC), quality=90),
}


def _changed(attrs: vocabulary.Attributes, keys: tuple[str, ...], rng: random.Random) -> vocabulary.Attributes:
    key = rng.choice([k for k in keys if k != "position" or attrs.count == 1])
    choices = [v for v in vocabulary.VALUES[key] if v not in (getattr(attrs, key), None)]
    if key == "background":
        choices = [v for v in choices if v != attrs.colour]  # a shape never matches its background
    return dataclasses.replace(attrs, **{key: rng.choice(choices)})


def _quantiles(values: np.ndarray) -> dict[str, float]:
    return {f"p{q}": round(float(np.percentile(values, q)), 3) for q in (1, 5, 25, 50, 75, 95, 99)}


def cosine_threshold(same: np.ndarray, other: np.ndarray) -> float:
    """The lowest cosine on a 0.01 grid that at most FALSE_POSITIVE_RATE of `other` reach."""
    for step in range(50, 101):
        threshold = step / 100
        if np.mean(other >= threshold) <= FALSE_POSITIVE_RATE:
            return threshold
    return 1.0


def measure_cosines(scenes: int, precision: str = "int8") -> dict[str, object]:
    towers = OnnxTowers(SHIPPED_MODEL_DIR, precision)
    rng = random.Random(3)
    gallery = dataset.demo_gallery(scenes)
    shots = [s.image() for s in gallery]

    def unit(images: list[Image.Image]) -> np.ndarray:
        vectors = towers.images(images)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    base = unit(shots)

    def scores(images: list[Image.Image]) -> np.ndarray:
        return np.sum(base * unit(images), axis=1)

    same = scores([dataset.render(s.attributes, seed=s.index + OTHER_SHOT_SEED) for s in gallery])
    other = scores([dataset.render(_changed(s.attributes, SCENE_KEYS, rng), seed=s.index + 13) for s in gallery])
    reframed = scores([dataset.render(_changed(s.attributes, FRAMING_KEYS, rng), seed=s.index + 17) for s in gallery])
    edits = {
        "jpeg_q40": scores([decoded(encoded(im, quality=40)) for im in shots]),
        "half": scores([im.resize((im.width // 2, im.height // 2), Image.Resampling.BICUBIC) for im in shots]),
        "crop_10pct": scores([crop(im, 0.1) for im in shots]),
    }
    threshold = cosine_threshold(same, other)
    return {
        "model": "cnclip-demo",
        "precision": precision,
        "scenes": scenes,
        "threshold": threshold,
        "same_scene_recall": round(float(np.mean(same >= threshold)), 3),
        "other_scene_passing": round(float(np.mean(other >= threshold)), 3),
        "reframed_passing": round(float(np.mean(reframed >= threshold)), 3),
        "edits_passing": {name: round(float(np.mean(v >= threshold)), 3) for name, v in edits.items()},
        "same_scene": _quantiles(same),
        "other_scene": _quantiles(other),
        "reframed": _quantiles(reframed),
        "edits": {name: _quantiles(v) for name, v in edits.items()},
    }


def _hash(data: bytes, phash: Callable[[bytes], int | None] = phash_of_bytes) -> int:
    value = phash(data)
    assert value is not None
    return value


def _bits(a: int, b: int) -> int:
    return bin((a ^ b) & (2**64 - 1)).count("1")


def hash_distances(
    pictures: list[Image.Image], phash: Callable[[bytes], int | None] = phash_of_bytes
) -> dict[str, object]:
    """Distances between each picture and its edits, and between distinct pictures (`phash`: the hash
    compared, benchmarks/bench_phash.py passes an earlier version's)."""
    hashes = [_hash(encoded(im, quality=95), phash) for im in pictures]
    edits = {
        name: [_bits(h, _hash(edit(im), phash)) for h, im in zip(hashes, pictures, strict=True)]
        for name, edit in EDITS.items()
    }
    every_edit = np.array([d for values in edits.values() for d in values])
    distinct = np.array([_bits(a, b) for a, b in itertools.combinations(hashes, 2)])
    return {
        "pictures": len(pictures),
        "edit_max": {name: int(max(values)) for name, values in edits.items()},
        "edit_p99": float(np.percentile(every_edit, 99)),
        "distinct_min": int(distinct.min()),
        "distinct_p01": float(np.percentile(distinct, 0.1)),
    }


def measure(scenes: int = 300, photos: int = 100, precision: str = "int8") -> dict[str, object]:
    return {
        "cosine": measure_cosines(scenes, precision),
        "phash_photo_like": hash_distances([photo_like(seed) for seed in range(photos)]),
        "phash_demo_gallery": hash_distances([s.image() for s in dataset.demo_gallery(photos)]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenes", type=int, default=300)
    parser.add_argument("--photos", type=int, default=100)
    parser.add_argument("--precision", choices=("int8", "fp32"), default="int8")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.scenes, args.photos, args.precision)
    print(json.dumps(result, ensure_ascii=False, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
