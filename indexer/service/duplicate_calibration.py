"""Where "similar shots" start, measured on the collection with its own model (docs/duplicates.md).

A cosine that separates shots of one scene from different photos depends on the model and on the
photos: the demo model puts drawn shapes of different scenes below 0.76 and unrelated real photos at
0.92–0.98. So the threshold is measured per collection, with the collection's model:

- **same shot** scores: up to `SAMPLE` items, drawn with a fixed seed, each edited `len(EDITS)` ways
  (a 90 % centre crop, exposure +20 % and −20 %, a 4 % shift, a JPEG re-encode at quality 70 — edits
  milder than a second shot of a scene), embedded with the model; the score of each edit with the
  item's stored vector;
- **different photo** scores: each sampled item's cosine with its nearest OTHER item of the
  collection (all stored vectors, read in chunks), leaving out items of the same picture (perceptual
  hashes within the resized tier's bits: a re-encode is not "another photo") and items whose EXIF
  date is within `BURST_S` of its own (a burst or a second take of the scene: exactly what the tier
  should find, not a different photo).

The threshold lies halfway between the same-shot scores' `POSITIVE_QUANTILE` (5 %: 95 % of edits
score above) and the different-photo scores' `NEGATIVE_QUANTILE` (95 %), when the first exceeds
the second by at least `MARGIN`. Otherwise the model cannot tell another shot from another photo on
this collection, and the similar tier is **off**, with the reason; the resized tier (perceptual
hash) still works, its cosine gate then being the same-shot quantile (a re-encode or a resize of a
picture scores at least what its crops and exposure changes do). Fewer than `MIN_SAMPLE` measurable
items (the collection is too small, or their files are gone): the model's default threshold
(retrieval/relevance.py), saying so.

Stored with the collection (`duplicate_calibrations`, revision 0007) with the model id, the generation
and the item count it was measured at; measured again (`stale_reason`) when the collection's model
or generation changed, when it grew to `GROWTH` times (or shrank to 1/`GROWTH` of) that count, or
when this measurement's `VERSION` changed. `CNCLIP_DUPLICATE_THRESHOLD` and a request's threshold
override it.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime

import numpy as np
from PIL import Image

from indexer.domain.duplicate_pages import MIN_THRESHOLD
from indexer.domain.duplicates import CALIBRATION_VERSION, Calibration
from indexer.domain.perceptual import HAMMING_THRESHOLD, hamming
from indexer.domain.records import CollectionState
from indexer.service.ports import DuplicateStore
from retrieval.errors import InvalidImage
from retrieval.preprocess import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, decode_image

VERSION = CALIBRATION_VERSION
SAMPLE = 48  # items measured (the cost: SAMPLE × (1 + edits) images embedded once per calibration)
SEED = 20_261_205
EDITS = ("crop90", "brighter", "darker", "shift", "jpeg70")
POSITIVE_QUANTILE = 0.05
NEGATIVE_QUANTILE = 0.95
MARGIN = 0.01
MIN_SAMPLE = 8
GROWTH = 1.5
EDIT_SIDE = 640  # px: the longer side edits are made at (the model sees 224 px)
CHUNK = 4096  # stored vectors compared per step for the nearest other item
BURST_S = 120.0  # seconds: EXIF dates this close are one scene, never a "different photo"


def edits_of(image: Image.Image) -> list[bytes]:
    """The edited copies of one picture (JPEG q92 apart from the re-encode), in `EDITS` order."""
    rgb = image.convert("RGB")
    if max(rgb.size) > EDIT_SIDE:
        rgb.thumbnail((EDIT_SIDE, EDIT_SIDE), Image.Resampling.LANCZOS)
    w, h = rgb.size
    dx, dy = max(1, round(w * 0.05)), max(1, round(h * 0.05))
    shift_x, shift_y = max(1, round(w * 0.04)), max(1, round(h * 0.04))
    pixels = np.asarray(rgb, dtype=np.float32)
    made = [
        rgb.crop((dx, dy, w - dx, h - dy)),
        Image.fromarray(np.clip(pixels * 1.2, 0, 255).astype(np.uint8)),
        Image.fromarray(np.clip(pixels * 0.8, 0, 255).astype(np.uint8)),
        rgb.crop((shift_x, shift_y, w, h)).resize((w, h), Image.Resampling.BICUBIC),
    ]
    out = [_jpeg(picture, 92) for picture in made]
    out.append(_jpeg(rgb, 70))
    return out


def _jpeg(image: Image.Image, quality: int) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def sample_ids(ids: np.ndarray) -> np.ndarray:
    """Up to `SAMPLE` ids, the same ones for the same collection content (a fixed seed)."""
    if len(ids) <= SAMPLE:
        return np.sort(ids)
    return np.sort(np.random.default_rng(SEED).choice(np.sort(ids), SAMPLE, replace=False))


def nearest_other(
    sampled: np.ndarray,
    sampled_vectors: np.ndarray,
    all_ids: np.ndarray,
    vectors_of: Callable[[np.ndarray], np.ndarray],
    hashes: dict[int, int],
    taken: dict[int, float] | None = None,
) -> np.ndarray:
    """Per sampled item, the highest cosine with another item that is not the same picture (by
    perceptual hash) nor taken within `BURST_S` of it (EXIF dates, epoch seconds in `taken`); -1 when
    it has none."""
    taken = taken or {}
    own_time = np.array([taken.get(int(i), np.nan) for i in sampled], dtype=np.float64)
    best = np.full(len(sampled), -1.0)
    own = np.array([hashes.get(int(i), 0) for i in sampled], dtype=np.int64)
    has_hash = np.array([int(i) in hashes for i in sampled])
    for start in range(0, len(all_ids), CHUNK):
        chunk = all_ids[start : start + CHUNK]
        scores = sampled_vectors @ vectors_of(chunk).T  # (sampled, chunk)
        scores[sampled[:, None] == chunk[None, :]] = -1.0
        chunk_hashes = np.array([hashes.get(int(i), 0) for i in chunk], dtype=np.int64)
        chunk_has = np.array([int(i) in hashes for i in chunk])
        for row in np.flatnonzero(has_hash):
            bits = hamming(np.full(len(chunk), own[row]), chunk_hashes)
            scores[row, chunk_has & (bits <= HAMMING_THRESHOLD)] = -1.0
        chunk_time = np.array([taken.get(int(i), np.nan) for i in chunk], dtype=np.float64)
        with np.errstate(invalid="ignore"):
            scores[np.abs(own_time[:, None] - chunk_time[None, :]) <= BURST_S] = -1.0  # NaN: never
        best = np.maximum(best, scores.max(axis=1, initial=-1.0))
    return best


def decide(
    state: CollectionState, item_count: int, positives: np.ndarray, negatives: np.ndarray, sampled: int
) -> Calibration:
    """The threshold from the two score sets (see the module docstring)."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    negatives = negatives[negatives > -1.0]
    base = Calibration(
        state.model, state.generation, item_count, sampled, None, None, None, None, "", "too_few", computed_at=now
    )
    if len(negatives) < MIN_SAMPLE or len(positives) == 0:
        return replace(
            base,
            same_shot_low=_q(positives, POSITIVE_QUANTILE),
            different_photo_high=_q(negatives, NEGATIVE_QUANTILE),
            threshold=None,
            resized_gate=None,
            reason=f"too few photos to measure where similar shots start ({len(negatives)} measured, "
            f"{MIN_SAMPLE} needed): the model's default threshold is used until the collection grows",
            reason_code="too_few",
        )
    low = float(np.quantile(positives, POSITIVE_QUANTILE))
    high = float(np.quantile(negatives, NEGATIVE_QUANTILE))
    gate = round(max(MIN_THRESHOLD, min(low, 1.0)), 4)
    if low - high < MARGIN:
        return replace(
            base,
            same_shot_low=round(low, 4),
            different_photo_high=round(high, 4),
            threshold=None,
            resized_gate=gate,
            reason=f"this model cannot tell another shot from another photo in this collection: 5 % of edited "
            f"copies of a photo score below {low:.3f} with it, while 5 % of photos score {high:.3f} or more with "
            "their nearest other photo; the similar tier is off (identical and resized still work)",
            reason_code="overlap",
        )
    threshold = round(min(max((low + high) / 2, MIN_THRESHOLD), 1.0), 4)
    return replace(
        base,
        same_shot_low=round(low, 4),
        different_photo_high=round(high, 4),
        threshold=threshold,
        resized_gate=None,
        reason=f"halfway between edited copies of a photo (95 % score {low:.3f} or more) and photos' nearest "
        f"other photos (95 % score below {high:.3f}), measured on {sampled} photos",
        reason_code="calibrated",
    )


def finish(state: CollectionState, measured: Sequence[tuple[int, np.ndarray]], store: DuplicateStore) -> Calibration:
    """Score (item id, vectors of its edits) against the stored vectors, find each sampled item's
    nearest other item, decide, and store the calibration with the collection."""
    all_ids = store.item_ids(state.id)
    present = set(all_ids.tolist())
    ids = np.array([item_id for item_id, _ in measured if item_id in present], dtype=np.int64)
    edits = {item_id: vectors for item_id, vectors in measured}
    stored = store.vectors(ids) if len(ids) else np.empty((0, state.dim), np.float32)
    positives = np.concatenate([edits[int(i)] @ stored[row] for row, i in enumerate(ids)]) if len(ids) else np.empty(0)
    hashed, hashes = store.hashed_items(state.id)
    by_id = dict(zip(hashed.tolist(), hashes.tolist(), strict=True))
    negatives = nearest_other(ids, stored, all_ids, store.vectors, by_id, store.exif_times(state.id))
    result = decide(state, len(all_ids), positives, negatives, len(ids))
    store.save_calibration(state.id, result)
    return result


def _q(values: np.ndarray, q: float) -> float | None:
    return round(float(np.quantile(values, q)), 4) if len(values) else None


def decode_for_edits(data: bytes) -> Image.Image | None:
    try:
        return decode_image(data, DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, draft=2 * EDIT_SIDE)
    except InvalidImage:
        return None


def stale_reason(stored: Calibration | None, state: CollectionState, item_count: int) -> str | None:
    """Why the stored calibration must be measured again (None: it holds)."""
    if stored is None:
        return "not measured yet"
    if stored.version != VERSION:
        return "measured by an older rule"
    if stored.model != state.model or stored.generation != state.generation:
        return "the collection's model changed"
    if item_count >= GROWTH * stored.item_count and item_count > stored.item_count:
        return f"the collection grew from {stored.item_count} to {item_count} items"
    if item_count * GROWTH <= stored.item_count:
        return f"the collection shrank from {stored.item_count} to {item_count} items"
    return None


def summary(calibration: Calibration | None) -> dict[str, object] | None:
    """The calibration as the API and `cnclip duplicates --json` show it."""
    return None if calibration is None else asdict(calibration)
