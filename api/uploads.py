"""Upload boundary: byte cap while reading, then a header-only image check (format, pixel cap)
so that bad uploads fail fast with 413/422 before any model or database work."""

from __future__ import annotations

import json

from fastapi import UploadFile

from api.config import Settings
from retrieval.errors import InvalidImage, InvalidInput, PayloadTooLarge
from retrieval.json_text import loads
from retrieval.preprocess import ImageHeader, read_header

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
    return read_header(data, settings.max_image_bytes, settings.max_image_pixels)


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
    return items
