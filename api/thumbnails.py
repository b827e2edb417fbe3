"""Thumbnails: made once per image on first request, cached under `data_dir/thumbs`.

Keyed by the image's sha256 (content, not id), so a replaced or re-added image never shows a
stale thumbnail. Written to a temporary file and renamed, so concurrent first requests are safe.
Decoded by the model's own `decode_image` (EXIF orientation, 16-bit scaled to 8 bits, first
frame) and converted to RGB as the preprocessing does, so a thumbnail shows the colours the model
saw: a 16-bit PNG is not white, a CMYK JPEG not inverted, a palette image keeps its colours.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from PIL import Image

from indexer.types import ItemRecord
from retrieval.errors import InvalidImage, NotFound
from retrieval.preprocess import DEFAULT_MAX_PIXELS, decode_image

THUMBNAIL_SIZE = 320  # longest side, px; sharp in a ~160-px grid cell on a 2x screen


def thumbnail_path(thumbs_dir: Path, item: ItemRecord) -> Path:
    key = item.sha256 or f"id-{item.id}"
    return thumbs_dir / key[:2] / f"{key}.jpg"


def make_thumbnail(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """An RGB image at most THUMBNAIL_SIZE px on its longest side. Raises `InvalidImage`."""
    image = decode_image(data, max_bytes=len(data), max_pixels=max_pixels, draft=THUMBNAIL_SIZE)
    try:
        thumb = image.convert("RGB")
        thumb.thumbnail((THUMBNAIL_SIZE, THUMBNAIL_SIZE), Image.Resampling.BICUBIC)
    except (OSError, ValueError) as exc:
        raise InvalidImage("the item's image cannot be converted to make a thumbnail") from exc
    return thumb


def ensure_thumbnail(source: Path, target: Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> Path:
    """The cached thumbnail of `source`, making it if needed. Blocking: call from a worker thread.
    `max_pixels` is the server's limit, which the image passed when it was indexed."""
    if target.exists():
        return target
    if not source.is_file():
        raise NotFound("the item's image file is missing")
    target.parent.mkdir(parents=True, exist_ok=True)
    thumb = make_thumbnail(source.read_bytes(), max_pixels)
    fd, tmp = tempfile.mkstemp(prefix=".thumb.", suffix=".jpg", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            thumb.save(f, "JPEG", quality=82, optimize=True)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
