"""Thumbnails: made once per content on first request, cached under `data_dir/thumbs`.

Keyed by content (the item's recorded sha256, plus the thumbnail size) and only ever made from
bytes that `indexer.storage.media.check.read_media` verified to have that sha256: a file swapped while it
is read can make the request fail, never put another image's thumbnail under the key, so a
poisoned thumbnail cannot be cached. A cached one is served after the cheaper `check_media` (the
file is still there, inside its folder, of the recorded size): its bytes are the indexed image's
whatever the file holds now. Written to a temporary file and renamed, so concurrent first requests
are safe; read back whole, so a deletion racing the response cannot cut it short.
Decoded by the model's own `decode_image` (EXIF orientation, 16-bit scaled to 8 bits, first
frame) and converted to RGB as the preprocessing does, so a thumbnail shows the colours the model
saw: a 16-bit PNG is not white, a CMYK JPEG not inverted, a palette image keeps its colours.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
from pathlib import Path
from typing import Protocol

from PIL import Image

from indexer.domain.records import ItemRecord
from retrieval.errors import InvalidImage
from retrieval.preprocess import DEFAULT_MAX_PIXELS, decode_image

log = logging.getLogger(__name__)

THUMBNAIL_SIZE = 320  # longest side, px; sharp in a ~160-px grid cell on a 2x screen


def thumbnail_path(thumbs_dir: Path, sha256: str) -> Path:
    """Where the thumbnail of the content with this sha256 is cached."""
    return thumbs_dir / sha256[:2] / f"{sha256}-{THUMBNAIL_SIZE}.jpg"


def make_thumbnail(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """An RGB image at most THUMBNAIL_SIZE px on its longest side. Raises `InvalidImage`."""
    image = decode_image(data, max_bytes=len(data), max_pixels=max_pixels, draft=THUMBNAIL_SIZE)
    try:
        thumb = image.convert("RGB")
        thumb.thumbnail((THUMBNAIL_SIZE, THUMBNAIL_SIZE), Image.Resampling.BICUBIC)
    except (OSError, ValueError) as exc:
        raise InvalidImage("the item's image cannot be converted to make a thumbnail") from exc
    return thumb


def save_thumbnail(data: bytes, target: Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> bytes:
    """The JPEG thumbnail of `data` (verified bytes), also cached at `target`. The cache is only a
    shortcut: when it cannot be written (the folder removed meanwhile, a full disk) the thumbnail is
    still returned, and made again next time."""
    buffer = io.BytesIO()
    make_thumbnail(data, max_pixels).save(buffer, "JPEG", quality=82, optimize=True)
    jpeg = buffer.getvalue()
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".thumb.", suffix=".jpg", dir=target.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(jpeg)
        os.replace(tmp, target)
    except OSError as exc:
        log.warning("thumbnail not cached at %s: %s", target, exc)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return jpeg


class MediaReader(Protocol):
    """Where an item's indexed bytes come from (the catalog, indexer/storage/media/check.py)."""

    def check_media(self, item: ItemRecord) -> None: ...

    def read_media(self, item: ItemRecord) -> bytes: ...


def item_thumbnail(
    item: ItemRecord, media: MediaReader, thumbs_dir: Path, max_pixels: int = DEFAULT_MAX_PIXELS
) -> bytes:
    """The JPEG thumbnail of `item`'s indexed image (see the module docstring); `NotFound` /
    `MediaChanged` like the image itself. Blocking: call from a worker thread. `max_pixels` is the
    server's limit, which the image passed when it was indexed."""
    media.check_media(item)  # a text, a missing file or one out of its folder: refused first
    target = thumbnail_path(thumbs_dir, item.sha256 or "")
    try:
        return target.read_bytes()
    except FileNotFoundError:
        pass
    return save_thumbnail(media.read_media(item), target, max_pixels)
