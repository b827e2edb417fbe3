"""Phone and camera photos built in memory, no downloads: HEIC (pillow-heif writes it), AVIF (Pillow
writes it), and a minimal DNG written here byte by byte (a TIFF with DNG tags, a 16-bit CFA image in a
sub-directory and an optional embedded JPEG preview) that LibRaw opens like a camera's."""

from __future__ import annotations

import io
import struct

import numpy as np
import pillow_heif
from PIL import Image

_SHORT, _LONG, _ASCII, _BYTE, _RATIONAL, _SRATIONAL = 3, 4, 2, 1, 5, 10
EXIF_IFD, ORIENTATION, DATETIME_ORIGINAL, OFFSET_TIME_ORIGINAL = 0x8769, 0x0112, 0x9003, 0x9011


def exif_bytes(orientation: int = 1, date: str | None = None, offset: str | None = None) -> bytes:
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    if date is not None:
        exif.get_ifd(EXIF_IFD)[DATETIME_ORIGINAL] = date
    if offset is not None:
        exif.get_ifd(EXIF_IFD)[OFFSET_TIME_ORIGINAL] = offset
    return exif.tobytes()


def picture(width: int = 300, height: int = 200, seed: int = 0) -> Image.Image:
    """A photo-like RGB picture: a gradient with a bright block in the top-left corner (shows orientation)."""
    x = np.linspace(0, 1, width)[None, :, None]
    y = np.linspace(0, 1, height)[:, None, None]
    zero = np.zeros((height, width, 1))
    rgb = np.concatenate([zero + x * 200 + 30, zero + y * 180 + 40, zero + (1 - x) * 120 + seed % 50], axis=2)
    rgb[: height // 4, : width // 4] = 250
    return Image.fromarray(rgb.astype(np.uint8))


def heic_bytes(image: Image.Image | None = None, exif: bytes | None = None, quality: int = 70) -> bytes:
    """HEIC via pillow-heif (which stores an EXIF orientation as the HEIF's own rotation)."""
    out = io.BytesIO()
    (image or picture()).save(out, "HEIF", quality=quality, **({"exif": exif} if exif else {}))
    return out.getvalue()


def avif_bytes(image: Image.Image | None = None, exif: bytes | None = None, quality: int = 70) -> bytes:
    out = io.BytesIO()
    (image or picture()).save(out, "AVIF", quality=quality, **({"exif": exif} if exif else {}))
    return out.getvalue()


def burst_heic(primary: Image.Image, other: Image.Image) -> bytes:
    """A two-image HEIC whose primary image is the second one (a burst, a Live Photo still)."""
    heif = pillow_heif.from_pillow(other)
    heif.add_from_pillow(primary)
    out = io.BytesIO()
    heif.save(out, quality=70, primary_index=1)
    return out.getvalue()


def with_declared_size(data: bytes, width: int, height: int) -> bytes:
    """HEIC/AVIF bytes whose `ispe` box (the declared image size) says width × height."""
    at = data.find(b"ispe")
    assert at > 0
    return data[: at + 8] + struct.pack(">II", width, height) + data[at + 16 :]


def with_brand(data: bytes, brand: bytes) -> bytes:
    return data[:8] + brand + data[12:]


def _directory(entries: dict[int, tuple[int, int, bytes]], at: int) -> bytes:
    """One little-endian TIFF directory at offset `at`, its long values right after it."""
    items = sorted(entries.items())
    body, extra = b"", b""
    extra_at = at + 2 + 12 * len(items) + 4
    for tag, (kind, count, value) in items:
        if len(value) <= 4:
            body += struct.pack("<HHI", tag, kind, count) + value.ljust(4, b"\0")
        else:
            body += struct.pack("<HHII", tag, kind, count, extra_at + len(extra))
            extra += value + b"\0" * (len(value) % 2)
    return struct.pack("<H", len(items)) + body + struct.pack("<I", 0) + extra


def _s(*v: int) -> tuple[int, int, bytes]:
    return _SHORT, len(v), struct.pack(f"<{len(v)}H", *v)


def _l(*v: int) -> tuple[int, int, bytes]:
    return _LONG, len(v), struct.pack(f"<{len(v)}I", *v)


def _a(text: str) -> tuple[int, int, bytes]:
    raw = text.encode() + b"\0"
    return _ASCII, len(raw), raw


def _b(*v: int) -> tuple[int, int, bytes]:
    return _BYTE, len(v), bytes(v)


def _sr(*v: float) -> tuple[int, int, bytes]:
    return _SRATIONAL, len(v), b"".join(struct.pack("<ii", round(x * 10000), 10000) for x in v)


def _r(*v: float) -> tuple[int, int, bytes]:
    return _RATIONAL, len(v), b"".join(struct.pack("<II", round(x * 10000), 10000) for x in v)


def dng_bytes(
    width: int = 64,
    height: int = 48,
    preview: Image.Image | None = None,
    orientation: int = 1,
    date: str | None = None,
    offset: str | None = None,
    make: str = "Canon",
    declared: tuple[int, int] | None = None,
) -> bytes:
    """A minimal DNG: IFD0 (DNG tags, the preview JPEG or a 1×1 placeholder, Orientation, an EXIF
    directory with the dates) and a raw sub-directory of width × height 12-bit RGGB samples.
    `declared`: the raw directory's stated size instead (a lie about the size, for the guards)."""
    rng = np.random.default_rng(1)
    cfa = rng.integers(400, 3600, size=(height, width)).astype("<u2").tobytes()
    jpeg = b"\x80\x80\x80"
    if preview is not None:
        buffer = io.BytesIO()
        preview.save(buffer, "JPEG", quality=90)
        jpeg = buffer.getvalue()
    ifd0_at, exif_at, raw_at, jpeg_at = 8, 1536, 2048, 4096
    cfa_at = jpeg_at + len(jpeg) + len(jpeg) % 2
    raw_w, raw_h = declared or (width, height)
    raw = {
        254: _l(0), 256: _l(raw_w), 257: _l(raw_h), 258: _s(16), 259: _s(1), 262: _s(32803),
        273: _l(cfa_at), 277: _s(1), 278: _l(raw_h), 279: _l(len(cfa)), 284: _s(1),
        33421: _s(2, 2), 33422: _b(0, 1, 1, 2), 50714: _l(0), 50717: _l(4095),
    }  # fmt: skip
    ifd0 = {
        50706: _b(1, 4, 0, 0), 50707: _b(1, 1, 0, 0), 271: _a(make), 272: _a(f"{make} Test"),
        50708: _a(f"{make} Test"), 274: _s(orientation), 330: _l(raw_at), 34665: _l(exif_at),
        50721: _sr(0.6722, -0.0635, -0.0963, -0.4287, 1.2460, 0.2028, -0.0908, 0.2162, 0.5668),
        50778: _s(21), 50728: _r(0.5, 1.0, 0.7), 254: _l(1), 259: _s(7 if preview else 1), 284: _s(1),
        256: _l(preview.width if preview else 1), 257: _l(preview.height if preview else 1),
        258: _s(8, 8, 8), 262: _s(6 if preview else 2), 273: _l(jpeg_at), 277: _s(3),
        278: _l(preview.height if preview else 1), 279: _l(len(jpeg)),
    }  # fmt: skip
    exif: dict[int, tuple[int, int, bytes]] = {}
    if date is not None:
        exif[DATETIME_ORIGINAL] = _a(date)
    if offset is not None:
        exif[OFFSET_TIME_ORIGINAL] = _a(offset)
    parts = [(ifd0_at, _directory(ifd0, ifd0_at)), (exif_at, _directory(exif, exif_at))]
    parts += [(raw_at, _directory(raw, raw_at)), (jpeg_at, jpeg), (cfa_at, cfa)]
    out = bytearray(b"II*\0" + struct.pack("<I", ifd0_at))
    for at, part in parts:
        assert len(out) <= at, "a directory overflowed its slot"
        out += b"\0" * (at - len(out)) + part
    return bytes(out)
