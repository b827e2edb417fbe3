"""Which member of a near-duplicate group to suggest keeping: the original (docs/duplicates.md).

Read from each member's bytes (`picture_quality`), compared within the group (`choose_keeper`), in
this order — the first that tells the members apart decides, and is the group's `keeper_reason`:

1. `more_detail`: the most real resolution. Not the pixel count: an upscaled copy has more pixels and
   no more detail. Each picture's upscale factor is estimated on a native-resolution centre crop
   (at most `CROP` px, greyscale): how much is lost by shrinking by f and enlarging back (LANCZOS
   both ways) for f in `FACTORS`. A natural photo (1/f spectrum) with detail up to its own pixels
   loses ln f / ln 8 of its f = 8 loss already at small f; a copy enlarged by 2 loses almost nothing
   until f > 2. The factor is the largest f whose loss is at most `UPSCALE_LOSS` of a natural photo's,
   and the real resolution is the longer side divided by it. Within `SAME_DETAIL` (10 %) of the
   best, members tie. Measured on 1/f-noise pictures: the original, a JPEG q40 and a half-size copy
   measure 1; enlarged by 2 (LANCZOS or BICUBIC) 2; by 1.5, 1.25; by 3 (BILINEAR), 2.5.
2. `not_upscaled`: of those, the smallest upscale factor (the copy that was not enlarged).
3. `lossless`: a lossless file (PNG, BMP, TIFF without JPEG compression, lossless WebP) over a lossy one.
4. `higher_quality`: the higher JPEG quality, estimated from the luminance quantisation table
   (the libjpeg scaling of the standard table, `jpeg_quality`).
5. `more_metadata`: the richest metadata: an EXIF date taken, GPS, the camera (make or model), a
   caption, tags.
6. `more_bytes`, then `oldest` (the smallest id): the last tie-breaks.

A picture whose bytes cannot be read (a file gone or changed since it was indexed) is judged by what
the catalog recorded (pixels, bytes, metadata) and never wins on a measurement it lacks. Steps 1 and
2 decode every member (~0.2 s for 12 MP), so they are measured only when a group's members differ in
size; members of one size (a burst, a re-encode) are judged from their headers alone.
A picture without measurable detail (a smooth gradient or soft blobs: less than `NO_DETAIL` lost at
f = 8; real photos carry sensor noise) has no upscale factor; when a member of a group has none, the
group skips steps 1 and 2 (enlarging such a picture loses nothing to tell).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from indexer.domain.duplicates import KeeperReason
from indexer.domain.records import ItemRecord
from retrieval.errors import InvalidImage
from retrieval.preprocess import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, decode_image

CROP = 512  # px: the centre crop the upscale factor is measured on, at native resolution
FACTORS = (1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)
UPSCALE_LOSS = 0.25  # a factor is "empty" when its loss is at most this share of a natural photo's
NO_DETAIL = 2.0  # grey levels² of loss at f = 8 below which a picture has no measurable detail
SAME_DETAIL = 0.9  # real resolutions within 10 % of the best tie
LOSSLESS_FORMATS = {"PNG", "BMP", "PPM", "QOI", "TGA"}

# The libjpeg standard luminance table (ITU-T T.81 K.1), row-major; Pillow returns tables in this order.
_STD_LUMA = np.array(
    [
        16, 11, 10, 16, 24, 40, 51, 61,
        12, 12, 14, 19, 26, 58, 60, 55,
        14, 13, 16, 24, 40, 57, 69, 56,
        14, 17, 22, 29, 51, 87, 80, 62,
        18, 22, 37, 56, 68, 109, 103, 77,
        24, 35, 55, 64, 81, 104, 113, 92,
        49, 64, 78, 87, 103, 121, 120, 101,
        72, 92, 95, 98, 112, 100, 103, 99,
    ],
    dtype=np.float64,
)  # fmt: skip


@dataclass(frozen=True)
class PictureQuality:
    """What one member's bytes say about it (None: unknown)."""

    longer_side: int
    upscale: float | None  # estimated upscale factor (1.0: real detail up to its own pixels)
    lossless: bool | None
    jpeg_quality: int | None
    metadata: tuple[str, ...]  # of: date, gps, camera, caption, tags

    @property
    def detail(self) -> float:
        """Real resolution: the longer side over the upscale factor (px; 0 when unknown)."""
        return self.longer_side / self.upscale if self.upscale else 0.0


def jpeg_quality(tables: dict[int, Sequence[int]] | None) -> int | None:
    """The libjpeg quality (1–100) whose scaled standard table is nearest the luminance table, or None."""
    if not tables or 0 not in tables or len(tables[0]) != 64:
        return None
    table = np.asarray(tables[0], dtype=np.float64)
    best, error = None, float("inf")
    for quality in range(1, 101):
        scale = 5000 / quality if quality < 50 else 200 - 2 * quality
        expected = np.clip(np.floor((_STD_LUMA * scale + 50) / 100), 1, 255)
        distance = float(np.abs(expected - table).sum())
        if distance < error:
            best, error = quality, distance
    return best


def upscale_factor(image: Image.Image) -> float | None:
    """The estimated factor this picture was enlarged by (1.0: not enlarged); None when it has no
    measurable detail. Measured on a native-resolution centre crop (see the module docstring)."""
    grey = image.convert("L")
    width, height = grey.size
    side_w, side_h = min(width, CROP), min(height, CROP)
    if min(side_w, side_h) < 32:
        return None
    left, top = (width - side_w) // 2, (height - side_h) // 2
    crop = grey.crop((left, top, left + side_w, top + side_h))
    pixels = np.asarray(crop, dtype=np.float64)
    losses = []
    for factor in FACTORS:
        small = crop.resize((max(1, round(side_w / factor)), max(1, round(side_h / factor))), Image.Resampling.LANCZOS)
        back = np.asarray(small.resize((side_w, side_h), Image.Resampling.LANCZOS), dtype=np.float64)
        # Leave out a border (the filters' edge effects), measure the rest.
        margin = 8
        losses.append(float(np.mean((pixels - back)[margin:-margin, margin:-margin] ** 2)))
    if losses[-1] < NO_DETAIL:
        return None
    # A natural photo (1/f spectrum) loses ln f / ln 8 of its f = 8 loss when shrunk by f.
    natural = np.log(FACTORS) / np.log(FACTORS[-1])
    empty = [
        f for f, loss, n in zip(FACTORS[:-1], losses, natural, strict=False) if loss <= UPSCALE_LOSS * n * losses[-1]
    ]
    return max(empty) if empty else 1.0


def _lossless(fmt: str | None, info: dict[Any, Any]) -> bool:
    fmt = (fmt or "").upper()
    if fmt == "TIFF":
        return str(info.get("compression", "raw")).lower() not in {"jpeg", "tiff_jpeg", "webp"}
    if fmt == "WEBP":
        return bool(info.get("lossless"))
    return fmt in LOSSLESS_FORMATS


def _metadata(image: Image.Image, item: ItemRecord) -> tuple[str, ...]:
    found: list[str] = []
    date: object = None
    gps: object = None
    camera: object = None
    try:
        exif = image.getexif()
        date = exif.get_ifd(0x8769).get(0x9003) or exif.get(0x0132)
        gps = exif.get_ifd(0x8825)
        camera = exif.get(0x010F) or exif.get(0x0110)
    except Exception:  # noqa: BLE001 — hostile EXIF: no metadata rather than no answer
        pass
    if date or item.taken_source == "exif":
        found.append("date")
    if gps:
        found.append("gps")
    if camera:
        found.append("camera")
    if item.caption:
        found.append("caption")
    if item.tags:
        found.append("tags")
    return tuple(found)


def picture_quality(
    data: bytes,
    item: ItemRecord,
    *,
    detail: bool = True,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> PictureQuality:
    """Measure one member from its bytes; on bytes that cannot be read, only what the catalog recorded.
    `detail`: also decode it (guards as for embedding) and measure its upscale factor — only needed
    when a group's members differ in size (a decode per member: ~0.2 s for 12 MP); otherwise the
    container's header (format, quantisation tables, EXIF) is all that is read."""
    fmt: str | None = None
    info: dict[Any, Any] = {}
    tables = None
    metadata: tuple[str, ...] | None = None
    side = 0
    try:  # the container's facts (a decoded image may be a converted copy without them)
        with Image.open(io.BytesIO(data)) as opened:
            fmt, info, tables = opened.format, dict(opened.info), getattr(opened, "quantization", None)
            side, metadata = max(opened.size), _metadata(opened, item)
    except Exception:  # noqa: BLE001 — hostile headers raise many kinds; the catalog's facts then
        fmt = None
    upscale = None
    if detail:
        try:
            image = decode_image(data, max_bytes, max_pixels)
        except InvalidImage:
            return recorded_quality(item)
        side, metadata = max(image.size), metadata if metadata is not None else _metadata(image, item)
        try:
            upscale = upscale_factor(image)
        except (OSError, ValueError):  # a mode Pillow cannot turn into greyscale
            upscale = None
    elif fmt is None or metadata is None:
        return recorded_quality(item)
    return PictureQuality(
        longer_side=side,
        upscale=upscale,
        lossless=_lossless(fmt, info) if fmt is not None else None,
        jpeg_quality=jpeg_quality(tables) if fmt == "JPEG" else None,
        metadata=metadata or (),
    )


def recorded_quality(item: ItemRecord) -> PictureQuality:
    """What the catalog alone says (the bytes could not be read)."""
    meta = tuple(
        name
        for name, present in (("date", item.taken_source == "exif"), ("caption", item.caption), ("tags", item.tags))
        if present
    )
    return PictureQuality(max(item.width or 0, item.height or 0), None, None, None, meta)


def choose_keeper(
    items: Sequence[ItemRecord], quality: Callable[[ItemRecord], PictureQuality]
) -> tuple[list[ItemRecord], KeeperReason]:
    """The members ordered, the suggested keeper first, and why it beats the runner-up."""
    measured = {item.id: quality(item) for item in items}
    known = all(q.upscale is not None for q in measured.values())  # else steps 1 and 2 are skipped
    best_detail = max(q.detail for q in measured.values())

    def key(item: ItemRecord) -> tuple[float, float, int, int, int, int, int]:
        q = measured[item.id]
        tied = not known or q.detail >= SAME_DETAIL * best_detail
        return (
            -best_detail if tied else -q.detail,
            (q.upscale or 1.0) if known else 1.0,
            -int(bool(q.lossless)),
            -(q.jpeg_quality or 0) if not q.lossless else 0,
            -len(q.metadata),
            -(item.size or 0),
            item.id,
        )

    ordered = sorted(items, key=key)
    if len(ordered) < 2:
        return ordered, KeeperReason("oldest", "the only member")
    first, second = ordered[0], ordered[1]
    a, b = key(first), key(second)
    qa, qb = measured[first.id], measured[second.id]
    texts = (
        ("more_detail", f"more real detail ({qa.detail:.0f} px vs {qb.detail:.0f} px along the longer side)"),
        ("not_upscaled", f"not enlarged (the other was upscaled about {qb.upscale or 1:g}×)"),
        ("lossless", "lossless where the other is a lossy re-encode"),
        ("higher_quality", f"higher JPEG quality ({qa.jpeg_quality or 0} vs {qb.jpeg_quality or 0})"),
        (
            "more_metadata",
            f"richer metadata ({', '.join(qa.metadata) or 'none'} vs {', '.join(qb.metadata) or 'none'})",
        ),
        ("more_bytes", f"the larger file ({first.size or 0} vs {second.size or 0} bytes)"),
        ("oldest", "indexed first (nothing else tells them apart)"),
    )
    for (code, text), x, y in zip(texts, a, b, strict=False):
        if x != y:
            return ordered, KeeperReason(code, text)
    return ordered, KeeperReason("oldest", "indexed first (nothing else tells them apart)")
