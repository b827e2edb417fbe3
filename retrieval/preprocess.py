"""Server-side image preprocessing, equal to cn_clip's `image_transform` (without torchvision).

cn_clip resizes the whole PIL image to (size, size) with BICUBIC (a squash, no centre crop), then
converts to RGB, scales to [0, 1] and normalises with CLIP's mean/std. The order matters: Pillow
resizes palette ("P") and bilevel ("1") images with NEAREST and RGBA/LA with premultiplied alpha,
and the reference does exactly that because it resizes before converting. We add what a server
needs in front: a byte and pixel budget (area and longest side) checked before decoding, a whitelist of raster formats
(no PDF/EPS/SVG decoders), EXIF orientation, the first frame of animations, and 16-bit images
scaled (not clipped) to 8 bits. Every failure becomes `InvalidImage` with a human message.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from retrieval.errors import InvalidImage, PayloadTooLarge
from retrieval.manifest import CNCLIP_MEAN, CNCLIP_STD

# Raster formats users upload. Pillow can open many more (EPS runs Ghostscript, PDF/SVG are not
# images), so anything else is refused before a decoder runs.
ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_PIXELS = 50_000_000
# Each side, whatever the pixel count. The cost of a decode and of the resize to the model's size grows
# with the longer side as well as with the area (PNG's per-row work; Pillow's resize weights per input
# row or column, computed holding the GIL): a 1×50,000,000 PNG is within the pixel cap and took 11 s
# here, freezing the event loop for most of it. 65,535 is JPEG's own limit per side.
MAX_IMAGE_SIDE = 65_535
_SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")

# Pillow's decoders signal corrupt input with many exception types (struct.error from a short
# header, SyntaxError from its plugin parsers, ZeroDivisionError from a zero-size tile...).
# They are all "this is not a usable image" and are reported as such, with the cause chained.
_DECODE_ERRORS = (
    OSError,
    ValueError,
    SyntaxError,
    EOFError,
    struct.error,
    IndexError,
    KeyError,
    TypeError,
    ZeroDivisionError,
    Image.DecompressionBombError,
    NotImplementedError,
)


def _check_size(data: bytes, max_bytes: int) -> None:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidImage(f"expected image bytes, got {type(data).__name__}")
    if len(data) == 0:
        raise InvalidImage("the image is empty (0 bytes)")
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"the image is {len(data):,} bytes; the limit is {max_bytes:,} bytes")


def _open(data: bytes, max_pixels: int) -> Image.Image:
    """Identify the format and check the declared size; no pixel data is decoded yet."""
    try:
        image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
    except UnidentifiedImageError as exc:
        raise InvalidImage(
            f"not a supported image (expected one of {', '.join(f.lower() for f in ALLOWED_FORMATS)})"
        ) from exc
    except Image.DecompressionBombError as exc:  # Pillow's own, much higher, guard
        raise InvalidImage(f"the image declares too many pixels; the limit is {max_pixels:,} pixels") from exc
    except _DECODE_ERRORS as exc:
        raise InvalidImage(f"the image header is corrupt: {exc}") from exc
    width, height = image.size
    if width < 1 or height < 1:
        raise InvalidImage(f"the image has no pixels ({width}×{height})")
    if width * height > max_pixels:
        raise InvalidImage(f"the image is {width}×{height} pixels; the limit is {max_pixels:,} pixels")
    if max(width, height) > MAX_IMAGE_SIDE:
        raise InvalidImage(f"the image is {width}×{height} pixels; each side may be at most {MAX_IMAGE_SIDE:,}")
    return image


def _mime(image: Image.Image) -> str:
    return Image.MIME.get(image.format or "", "application/octet-stream")


def probe_image(
    data: bytes, max_bytes: int = DEFAULT_MAX_BYTES, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[str, int, int]:
    """(mime type, width, height) from the header only, width/height as displayed (EXIF-rotated).

    Cheap (no pixel decoding); raises `InvalidImage` for anything `preprocess_image` would refuse
    at the header stage. A truncated body is only noticed by `preprocess_image`.
    """
    _check_size(data, max_bytes)
    image = _open(data, max_pixels)
    width, height = image.size
    if _orientation(image) in (5, 6, 7, 8):  # the transposing/rotating-by-90° orientations
        width, height = height, width
    return _mime(image), width, height


def _orientation(image: Image.Image) -> int:
    """The EXIF orientation, read without decoding pixels. Pillow's `getexif()` on a PNG decodes the whole
    image to look for an eXIf chunk after the pixel data (0.6 s for a 7000×7000 PNG, on every upload), so
    for PNG only a chunk before the pixels (where the PNG spec asks for it) is read here; the decoder
    (`decode_image`) still applies one that comes later."""
    try:
        if image.format == "PNG":
            raw = image.info.get("exif")
            if not isinstance(raw, bytes):
                return 1
            exif = Image.Exif()
            exif.load(raw)
            return int(exif.get(0x0112, 1))
        return int(image.getexif().get(0x0112, 1))
    except _DECODE_ERRORS:
        return 1  # unreadable EXIF: the pixels are what they are


def _to_8_bit(image: Image.Image) -> Image.Image:
    """16-bit and 32-bit integer greyscale scaled to 8 bits by its bit depth (not clipped at 255)."""
    if image.mode not in _SIXTEEN_BIT_MODES:
        return image
    array = np.asarray(image, dtype=np.float64)
    # Mode "I" is a 32-bit container that PNG and TIFF fill with 16-bit data; wider data keeps its range.
    top = max(65535.0, float(array.max(initial=0)))
    scaled = np.clip(np.rint(array * (255.0 / top)), 0, 255).astype(np.uint8)
    return Image.fromarray(scaled)


def decode_image(
    data: bytes, max_bytes: int = DEFAULT_MAX_BYTES, max_pixels: int = DEFAULT_MAX_PIXELS, draft: int | None = None
) -> Image.Image:
    """Decode the first frame, apply EXIF orientation and bring 16-bit images to 8 bits.

    `draft` (px): JPEGs may be decoded at a reduced scale no smaller than draft × draft — for
    thumbnails, never for the model (it would change the embeddings)."""
    _check_size(data, max_bytes)
    image = _open(data, max_pixels)
    try:
        image.seek(0)
        if draft is not None:
            image.draft(image.mode, (draft, draft))  # the same mode: only the scale changes
        image.load()
        image = ImageOps.exif_transpose(image) or image
    except _DECODE_ERRORS as exc:
        raise InvalidImage(f"the image data is corrupt or truncated: {exc}") from exc
    return _to_8_bit(image)


def normalise(
    image: Image.Image,
    size: int = 224,
    mean: Sequence[float] = CNCLIP_MEAN,
    std: Sequence[float] = CNCLIP_STD,
) -> np.ndarray:
    """cn_clip's transform on a decoded image: BICUBIC squash → RGB → /255 → (x - mean) / std, CHW."""
    try:
        resized = image.resize((size, size), Image.Resampling.BICUBIC).convert("RGB")
    except _DECODE_ERRORS as exc:
        raise InvalidImage(f"the image cannot be converted ({image.mode}): {exc}") from exc
    pixels = np.asarray(resized, dtype=np.float32).transpose(2, 0, 1) / np.float32(255.0)
    mean_a = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
    std_a = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)
    return np.ascontiguousarray((pixels - mean_a) / std_a, dtype=np.float32)


def preprocess_image(
    data: bytes,
    size: int = 224,
    mean: Sequence[float] = CNCLIP_MEAN,
    std: Sequence[float] = CNCLIP_STD,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Raw JPEG/PNG/... bytes → float32 (3, size, size), as cn_clip's model expects.

    Raises `PayloadTooLarge` above `max_bytes` and `InvalidImage` for anything that is not a
    usable image (empty, truncated, not an image, more than `max_pixels` pixels).
    """
    return normalise(decode_image(data, max_bytes, max_pixels), size, mean, std)
