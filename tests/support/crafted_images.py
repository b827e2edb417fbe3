"""Images written byte by byte for the decoding tests: hostile ones that stay within every size limit (a
progressive JPEG of thousands of scans, a PNG of a million chunks) and the pieces they are made of."""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

import numpy as np
from PIL import Image


def png_chunk(kind: bytes, body: bytes) -> bytes:
    """One PNG chunk: length, type, body, CRC of type and body."""
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
    """`image` saved as `fmt` (Pillow's save options), in memory."""
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def gradient(width: int, height: int, seed: int = 0) -> Image.Image:
    """A photo-like RGB picture: colour ramps with noise from `seed` (so that JPEG has detail to code)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], axis=-1)
    noise = rng.integers(0, 40, size=(height, width, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), "RGB")


def jpeg_of_scans(scans: int, side: int = 64) -> bytes:
    """A progressive JPEG of `scans` scans: libjpeg's 10, then its smallest scan repeated (each repeat a
    whole pass over the image when decoded, a few bytes in the file: a decode-cost bomb within every
    size limit, issue 28's hidden set)."""
    data = encode(gradient(side, side), "JPEG", progressive=True, quality=50)
    at, found = 2, []
    while data[at + 1] != 0xD9:  # walk the markers; a scan runs to the next marker that is not FF00/RSTn
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        end = at + 2 + length
        if data[at + 1] == 0xDA:
            while data[end] != 0xFF or data[end + 1] == 0 or 0xD0 <= data[end + 1] <= 0xD7:
                end += 1
            found.append((at, end))
        at = end
    assert len(found) == 10 and scans >= 10
    start, stop = min(found, key=lambda scan: scan[1] - scan[0])
    last = found[-1][1]
    return data[:last] + data[start:stop] * (scans - 10) + data[last:]


def png_of_chunks(chunks: int) -> bytes:
    """A valid 8×8 PNG of `chunks` chunks: IHDR, IDAT, IEND and empty private chunks before the IDAT
    (each one more step of Pillow's Python loop when it opens the file)."""

    pixels = zlib.compress(b"".join(b"\0" + b"\0" * 24 for _ in range(8)))
    header = png_chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0))
    return (
        b"\x89PNG\r\n\x1a\n"
        + header
        + png_chunk(b"prVt", b"") * (chunks - 3)
        + png_chunk(b"IDAT", pixels)
        + png_chunk(b"IEND", b"")
    )
