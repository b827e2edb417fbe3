"""Upload boundary: byte cap while reading, then a header-only image check (format, pixel cap)
so that bad uploads fail fast with 413/422 before any model or database work."""

from __future__ import annotations

import json
from collections.abc import Sequence

from fastapi import UploadFile

from api.config import Settings
from api.values import check_value
from retrieval.errors import InvalidImage, InvalidInput, PayloadTooLarge
from retrieval.image_budget import check_request_images, request_pixel_limit
from retrieval.json_text import loads
from retrieval.preprocess import ImageHeader

_CHUNK = 1 << 16


async def read_upload(file: UploadFile, max_bytes: int) -> bytes:
    """The upload's bytes; 413 as soon as more than `max_bytes` arrive, 422 when empty."""
    if file.size is not None and file.size > max_bytes:
        raise PayloadTooLarge(f"{file.filename or 'upload'} is {file.size} bytes; the limit is {max_bytes}")
    chunks, total = [], 0
    while chunk := await file.read(_CHUNK):
        total += len(chunk)
        if total > max_bytes:
            raise PayloadTooLarge(f"{file.filename or 'upload'} is larger than the limit of {max_bytes} bytes")
        chunks.append(chunk)
    if total == 0:
        raise InvalidImage(f"{file.filename or 'upload'} is empty")
    return b"".join(chunks)


def inspect_image(data: bytes, settings: Settings) -> ImageHeader:
    """Format, size and EXIF date from the header (no pixel decoding), with the same rules the
    encoder's preprocessing applies: the one header read of an upload, passed along to whoever needs
    it. Blocking: call from a worker thread."""
    return inspect_images([data], settings)[0]


def inspect_images(images: Sequence[bytes], settings: Settings) -> list[ImageHeader]:
    """`inspect_image` for every image of one request, and all of them together within the request's
    pixel budget (`CNCLIP_MAX_REQUEST_PIXELS`), before any is decoded: the one check of every route
    that takes images. Blocking: call from a worker thread."""
    limit = request_pixel_limit(settings.max_image_pixels, settings.max_request_pixels)
    return check_request_images(images, settings.max_image_bytes, settings.max_image_pixels, limit)


def parse_string_list(raw: str | None, field: str, max_items: int, max_chars: int) -> list[str] | None:
    """A form field holding a JSON list of strings, or comma-separated text (',' or '，')."""
    if raw is None or not raw.strip():
        return None
    raw = raw.strip()
    if raw.startswith("["):
        try:
            value = loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"{field} is not valid JSON: {exc.msg}") from exc
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidInput(f"{field} must be a JSON list of strings")
        items = [v.strip() for v in value]
    else:
        items = [v.strip() for v in raw.replace("，", ",").split(",")]
    items = [v for v in items if v]
    if len(items) > max_items:
        raise InvalidInput(f"{field} has {len(items)} entries; at most {max_items} are allowed")
    too_long = next((v for v in items if len(v) > max_chars), None)
    if too_long is not None:
        raise InvalidInput(f"{field} entry {too_long[:20]!r}... is longer than {max_chars} characters")
    check_value(items, field)  # the request text rule (api/values.py), for entries JSON escapes could hide
    return items
