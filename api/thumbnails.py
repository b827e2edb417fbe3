"""Thumbnails: made once per image on first request, cached under `data_dir/thumbs`.

Keyed by the image's sha256 (content, not id), so a replaced or re-added image never shows a
stale thumbnail. Written to a temporary file and renamed, so concurrent first requests are safe.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

from PIL import Image, ImageOps

from indexer.types import ItemRecord
from retrieval.errors import InvalidImage, NotFound

THUMBNAIL_SIZE = 320  # longest side, px; sharp in a ~160-px grid cell on a 2x screen


def thumbnail_path(thumbs_dir: Path, item: ItemRecord) -> Path:
    key = item.sha256 or f"id-{item.id}"
    return thumbs_dir / key[:2] / f"{key}.jpg"


def ensure_thumbnail(source: Path, target: Path) -> Path:
    """The cached thumbnail of `source`, making it if needed. Blocking: call from a worker thread."""
    if target.exists():
        return target
    if not source.is_file():
        raise NotFound("the item's image file is missing")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(source) as img:
                img.draft("RGB", (THUMBNAIL_SIZE, THUMBNAIL_SIZE))  # JPEG: decode at reduced scale
                thumb = ImageOps.exif_transpose(img).convert("RGB")
                thumb.thumbnail((THUMBNAIL_SIZE, THUMBNAIL_SIZE), Image.Resampling.BICUBIC)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidImage("the item's image cannot be read to make a thumbnail") from exc
    fd, tmp = tempfile.mkstemp(prefix=".thumb.", suffix=".jpg", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            thumb.save(f, "JPEG", quality=82, optimize=True)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
