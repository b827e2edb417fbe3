"""The pixel budget of one request: every image's header is read (no pixel decoded) and checked on its
own (`read_header`: bytes, format, `CNCLIP_MAX_IMAGE_PIXELS`, each side) and all of them together
against `CNCLIP_MAX_REQUEST_PIXELS`, before any of them is decoded.

A request of 150 PNGs of 7000×7000 zeros (143 KB each, under the per-image cap one by one) took 149 s
of decoding (issue 28); the request budget caps what one request can cost. The one rule every route
that takes images applies, however many images it takes (api/uploads.py `inspect_images`).
"""

from __future__ import annotations

from collections.abc import Sequence

from retrieval.errors import InvalidImage, PayloadTooLarge
from retrieval.preprocess import ImageHeader, read_header

# The default request budget, in images of the largest size: eight 50-Mpx images (400 Mpx), which holds
# a full /v1/embed/image request or an indexing batch of 32 twelve-megapixel photos (384 Mpx) and costs
# one worker about 4 s of decoding (0.5 s per 49-Mpx PNG here), where 150 such images took 149 s.
DEFAULT_IMAGES_PER_REQUEST = 8


def request_pixel_limit(max_image_pixels: int, max_request_pixels: int | None) -> int:
    """The pixels one request's images may hold together: the setting, or 8 × the per-image limit."""
    return max_request_pixels if max_request_pixels is not None else DEFAULT_IMAGES_PER_REQUEST * max_image_pixels


def check_request_images(
    images: Sequence[bytes], max_bytes: int, max_pixels: int, max_request_pixels: int
) -> list[ImageHeader]:
    """The headers of a request's images, in order, once each is within the per-image rules and all of
    them together hold at most `max_request_pixels` pixels. Blocking (Pillow reads each header).

    Raises `InvalidImage` / `PayloadTooLarge` naming the image (`image i: …` when there are several)
    and, over the request budget, `PayloadTooLarge` naming `CNCLIP_MAX_REQUEST_PIXELS`."""
    headers: list[ImageHeader] = []
    total = 0
    for index, data in enumerate(images):
        try:
            header = read_header(data, max_bytes, max_pixels)
        except InvalidImage as exc:
            if len(images) > 1:
                raise type(exc)(f"image {index}: {exc.message}") from exc
            raise
        total += header.width * header.height
        if total > max_request_pixels:
            raise PayloadTooLarge(
                f"the request's images hold more than {max_request_pixels:,} pixels together "
                f"({total:,} up to image {index}); the limit per request is CNCLIP_MAX_REQUEST_PIXELS "
                f"({max_request_pixels:,}): send fewer or smaller images per request"
            )
        headers.append(header)
    return headers
