"""The item page's browser-readable rendition of an image: `GET /v1/items/{id}/image?format=jpeg`.

Made from bytes the collection service verified (`CollectionService.media`: the indexed bytes, by
sha256), decoded by the one decoder (retrieval/preprocess.py: a HEIC's primary image, a RAW's preview
or demosaic, EXIF orientation), on each request: no file is written. Thumbnails are JPEG already
(indexer/service/thumbnails.py); the original bytes stay at `/image`, to download.
"""

from __future__ import annotations

import io

from PIL import Image

from retrieval.errors import InvalidImage
from retrieval.preprocess import DEFAULT_MAX_PIXELS, decode_image

RENDITION_SIZE = 2048  # longest side, px, of the item page's browser-readable rendition
# What every current browser shows in an <img>; anything else (HEIC, TIFF, camera RAW) is shown through
# `jpeg_rendition` (GET /v1/items/{id}/image?format=jpeg), its original bytes still served as they are.
BROWSER_MIMES = frozenset({"image/jpeg", "image/png", "image/webp", "image/gif", "image/avif", "image/bmp"})


def jpeg_rendition(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> bytes:
    """A JPEG of verified image bytes, at most RENDITION_SIZE px on its longest side, EXIF-oriented,
    decoded like the thumbnail (HEIC's primary image, a RAW's preview or demosaic). `InvalidImage`."""
    image = decode_image(data, max_bytes=len(data), max_pixels=max_pixels, draft=RENDITION_SIZE)
    try:
        rendition = image.convert("RGB")
        rendition.thumbnail((RENDITION_SIZE, RENDITION_SIZE), Image.Resampling.BICUBIC)
    except (OSError, ValueError) as exc:
        raise InvalidImage("the item's image cannot be converted to JPEG") from exc
    buffer = io.BytesIO()
    rendition.save(buffer, "JPEG", quality=88, optimize=True)
    return buffer.getvalue()
