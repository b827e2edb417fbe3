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

import functools
import io
import struct
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pillow_heif
from PIL import Image, ImageOps, UnidentifiedImageError

from retrieval import raw_photos
from retrieval.errors import ImageTooLarge, InvalidImage, PayloadTooLarge
from retrieval.manifest import CNCLIP_MEAN, CNCLIP_STD

# HEIC/HEIF through pillow-heif, registered once here, the one decoder every image goes through; the
# HEIF's own thumbnails, depth and auxiliary images are never read. Pillow reads AVIF itself.
pillow_heif.register_heif_opener(thumbnails=False, depth_images=False, aux_images=False)

# Raster formats users upload. Pillow can open many more (EPS runs Ghostscript, PDF/SVG are not
# images), so anything else is refused before a decoder runs.
# Phones' HEIC/HEIF and AVIF too; AVIF is tried before HEIF (both accept the `mif1` brand, and only
# Pillow's AVIF decodes AV1). Camera RAWs are recognised before these (retrieval/raw_photos.py).
ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "AVIF", "HEIF")
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_PIXELS = 50_000_000
# Each side, whatever the pixel count. The cost of a decode and of the resize to the model's size grows
# with the longer side as well as with the area (PNG's per-row work; Pillow's resize weights per input
# row or column, computed holding the GIL): a 1×50,000,000 PNG is within the pixel cap and took 11 s
# here, freezing the event loop for most of it. 65,535 is JPEG's own limit per side.
MAX_IMAGE_SIDE = 65_535
# Scans per JPEG. A progressive JPEG's decoding walks the whole image once per scan, whatever the scan
# holds: a 1.2 MB JPEG of 16 Mpx whose 31-byte scan is repeated 20,000 times took 22 s to decode (a
# 20 MB one would take minutes), within every size limit. Encoders write 1 (baseline) to about 10
# (libjpeg's progressive script; mozjpeg's stay under 30); 100 costs at most ~1 s more at 50 Mpx.
MAX_JPEG_SCANS = 100
# Chunks per PNG. Pillow walks a PNG's chunks in Python, on every open: a 20 MB PNG of 64×64 pixels and
# 1.7 million empty chunks took 9 s to read and decode. Encoders write IDAT chunks of 8 KB or more
# (2,560 for 20 MB); 50,000 is walked in about 25 ms.
MAX_PNG_CHUNKS = 50_000
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
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
    RuntimeError,  # libheif's and libavif's errors (a wrong brand, a missing image item)
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
    _check_scans(data)  # before Pillow reads anything: it walks a PNG's chunks in Python when opening it
    _check_png_chunks(data)
    try:
        image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
    except UnidentifiedImageError as exc:
        raise InvalidImage(
            f"not a supported image (expected one of {', '.join(f.lower() for f in ALLOWED_FORMATS)})"
        ) from exc
    except Image.DecompressionBombError as exc:  # Pillow's own, much higher, guard
        raise ImageTooLarge(f"the image declares too many pixels; the limit is {max_pixels:,} pixels") from exc
    except _DECODE_ERRORS as exc:
        raise InvalidImage(f"the image header is corrupt: {exc}") from exc
    width, height = image.size
    if width < 1 or height < 1:
        raise InvalidImage(f"the image has no pixels ({width}×{height})")
    if width * height > max_pixels:
        raise ImageTooLarge(f"the image is {width}×{height} pixels; the limit is {max_pixels:,} pixels")
    if max(width, height) > MAX_IMAGE_SIDE:
        raise ImageTooLarge(f"the image is {width}×{height} pixels; each side may be at most {MAX_IMAGE_SIDE:,}")
    return image


def _check_png_chunks(data: bytes) -> None:
    """Refuse a PNG (APNG too) of more than `MAX_PNG_CHUNKS` chunks, counted by stepping over chunk
    headers (no byte inflated) and never more than that many steps."""
    if bytes(data[:8]) != _PNG_SIGNATURE:
        return
    position, chunks = 8, 0
    while position + 8 <= len(data):
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            raise InvalidImage(
                f"the PNG has more than {MAX_PNG_CHUNKS:,} chunks (each is read one by one; encoders write a few "
                "thousand at most)"
            )
        (length,) = struct.unpack_from(">I", data, position)
        if data[position + 4 : position + 8] == b"IEND":
            return
        position += 12 + length


def _check_scans(data: bytes) -> None:
    """Refuse a JPEG (MPO and camera previews too) of more than `MAX_JPEG_SCANS` scans before decoding.
    Inside entropy-coded data a 0xFF byte is followed by 0x00, a restart marker or a marker, so counting
    the bytes FF DA (start of scan) counts the scans, or more (an EXIF thumbnail's own): never fewer."""
    if bytes(data[:2]) != b"\xff\xd8":
        return
    scans = _count_pairs(data, 0xFF, 0xDA)
    if scans > MAX_JPEG_SCANS:
        raise InvalidImage(
            f"the JPEG has {scans:,} scans; at most {MAX_JPEG_SCANS} are decoded (each costs a pass over "
            "the whole image; encoders write about 10)"
        )


def _count_pairs(data: bytes, first: int, second: int, chunk: int = 1 << 20) -> int:
    """How many times the byte `first` is followed by `second` in `data`: `bytes.count` of a two-byte
    needle took 191 µs for a 258 KB photo (on every decode, twice per indexed file), this 27 µs
    (BENCHMARKS.md, issue 34 on a Zen 5); a chunk at a time, so that a 20 MB file never costs more
    than a few MB of masks."""
    array = np.frombuffer(data, dtype=np.uint8)
    count = 0
    for start in range(0, max(len(array) - 1, 0), chunk):
        window = array[start : start + chunk + 1]  # one byte into the next chunk: a pair across the cut
        count += int(np.count_nonzero((window[:-1] == first) & (window[1:] == second)))
    return count


def _mime(image: Image.Image) -> str:
    return Image.MIME.get(image.format or "", "application/octet-stream")


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header says, read once without decoding pixels: the format, the size as
    displayed (EXIF-rotated) and the EXIF date fields, raw (indexer/domain/taken.py reads the date)."""

    mime: str
    width: int
    height: int
    date_original: object = None  # EXIF DateTimeOriginal (0x9003 of the Exif IFD), as stored
    offset_original: object = None  # EXIF OffsetTimeOriginal (0x9011), as stored


EXIF_IFD = 0x8769
DATETIME_ORIGINAL = 0x9003
OFFSET_TIME_ORIGINAL = 0x9011
ORIENTATION = 0x0112


def read_header(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageHeader:
    """The `ImageHeader` of `data`: one `Image.open`, no pixel decoding. Raises `InvalidImage` (or
    `PayloadTooLarge`) for anything `preprocess_image` would refuse at the header stage; a truncated
    body is only noticed by `preprocess_image`."""
    _check_size(data, max_bytes)
    kind = raw_photos.raw_kind(data)
    if kind is not None:
        try:
            raw = raw_photos.read_raw(data, kind, max_pixels, MAX_IMAGE_SIDE)
            return ImageHeader(raw.mime, raw.width, raw.height, raw.date_original, raw.offset_original)
        except raw_photos.RawUnreadable:
            if kind not in raw_photos.GUESSED_KINDS:
                raise  # a TIFF guessed to be a RAW that LibRaw cannot open is read as the TIFF it is
    image = _open(data, max_pixels)
    exif = _exif(image, data)
    width, height = image.size
    if int(exif.get(ORIENTATION, 1) or 1) in (5, 6, 7, 8):  # the transposing/rotating-by-90° orientations
        width, height = height, width
    dates = _exif_dates(exif)
    return ImageHeader(_mime(image), width, height, *dates)


def probe_image(
    data: bytes, max_bytes: int = DEFAULT_MAX_BYTES, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[str, int, int]:
    """(mime type, width, height) from the header only, width/height as displayed (see `read_header`)."""
    header = read_header(data, max_bytes, max_pixels)
    return header.mime, header.width, header.height


def _exif(image: Image.Image, data: bytes) -> Image.Exif:
    """The image's EXIF, read without decoding pixels (empty when unreadable: the pixels are what they
    are). Pillow's `getexif()` on a PNG decodes the whole image to look for an eXIf chunk after the
    pixel data (0.6 s for a 7000×7000 PNG, on every upload), so a PNG's chunks are walked instead."""
    exif = Image.Exif()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow warns about odd EXIF; odd EXIF is no EXIF
            if image.format != "PNG":
                return image.getexif()
            raw = image.info.get("exif")
            raw = raw if isinstance(raw, bytes) else _png_exif_chunk(data)
            if raw:
                exif.load(raw)
    except _DECODE_ERRORS:
        return Image.Exif()
    return exif


def _png_exif_chunk(data: bytes) -> bytes | None:
    """The body of a PNG's eXIf chunk wherever it is (the spec wants it before the pixel data, some
    writers put it after), found by stepping over chunk headers: no pixel is inflated."""
    position = 8  # the signature
    while position + 8 <= len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        if kind == b"eXIf":
            return data[position + 8 : position + 8 + length]
        if kind == b"IEND":
            return None
        position += 12 + length  # length, type, body, crc
    return None


def _exif_dates(exif: Image.Exif) -> tuple[object, object]:
    """(DateTimeOriginal, OffsetTimeOriginal) as stored; (None, None) when absent or unreadable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fields = exif.get_ifd(EXIF_IFD)
        return fields.get(DATETIME_ORIGINAL), fields.get(OFFSET_TIME_ORIGINAL)
    except _DECODE_ERRORS:
        return None, None


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
    thumbnails, never for the model (it would change the embeddings). A camera RAW gives its embedded
    preview or a half-size demosaic (retrieval/raw_photos.py), a multi-image HEIC its primary image."""
    _check_size(data, max_bytes)
    kind = raw_photos.raw_kind(data)
    if kind is not None:
        try:
            pixels = raw_photos.decode_raw(data, max_pixels, MAX_IMAGE_SIDE)
        except raw_photos.RawUnreadable:
            if kind not in raw_photos.GUESSED_KINDS:
                raise
        else:
            if isinstance(pixels.pixels, Image.Image):
                return pixels.pixels
            # The preview is a JPEG like any other (same limits); LibRaw's flip, if any, is the orientation.
            preview = _decode_opened(_open(pixels.pixels, max_pixels), draft, transpose=pixels.flip == 0)
            return raw_photos.flipped(preview, pixels.flip)
    return _decode_opened(_open(data, max_pixels), draft)


def _decode_opened(image: Image.Image, draft: int | None, transpose: bool = True) -> Image.Image:
    """`decode_image` after `_open`: the frame's pixels, EXIF-oriented, at most 8 bits."""
    try:
        if image.format != "HEIF":  # pillow-heif opens a HEIF at its primary image, not at image 0
            image.seek(0)
        if draft is not None:
            image.draft(image.mode, (draft, draft))  # the same mode: only the scale changes
        image.load()
        if transpose:  # in place: otherwise an upright image is copied whole (36 MB for a 12 MP photo)
            ImageOps.exif_transpose(image, in_place=True)
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
    rgb = np.asarray(resized)
    table = _normalised_values(tuple(mean), tuple(std))
    pixels = np.empty((3, *rgb.shape[:2]), dtype=np.float32)
    for channel in range(3):
        np.take(table[channel], rgb[:, :, channel], out=pixels[channel])
    return pixels


@functools.lru_cache(maxsize=8)
def _normalised_values(mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """(3, 256) float32: each channel's 256 byte values through cn_clip's arithmetic, in float32 as it
    runs per pixel (x / 255, minus the mean, over the std): looking a pixel up gives the very same
    bits (tests/retrieval/test_preprocess.py), in less than half the time of the passes (170 µs of
    405 for 224×224). Read-only: every call of this model shares it."""
    values = np.arange(256, dtype=np.float32) / np.float32(255.0)
    mean_a = np.asarray(mean, dtype=np.float32).reshape(3, 1)
    std_a = np.asarray(std, dtype=np.float32).reshape(3, 1)
    table = (values[None, :] - mean_a) / std_a
    table.flags.writeable = False
    return table


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


@dataclass(frozen=True)
class ImagePreprocessor:
    """One model's `preprocess_image` with its limits, callable on bytes (what the encoder runs on each
    image), and its two halves apart for a caller that uses the decoded image too: the bulk indexer
    takes the perceptual hash from the same decode (indexer/bulk/embedding.py)."""

    size: int = 224
    mean: Sequence[float] = CNCLIP_MEAN
    std: Sequence[float] = CNCLIP_STD
    max_bytes: int = DEFAULT_MAX_BYTES
    max_pixels: int = DEFAULT_MAX_PIXELS

    def decode(self, data: bytes) -> Image.Image:
        return decode_image(data, self.max_bytes, self.max_pixels)

    def normalise(self, image: Image.Image) -> np.ndarray:
        return normalise(image, self.size, self.mean, self.std)

    def __call__(self, data: bytes) -> np.ndarray:
        return self.normalise(self.decode(data))

    def observed(
        self, on_decoded: Callable[[int, Image.Image], None] | None
    ) -> Callable[[tuple[int, bytes]], np.ndarray]:
        """This preprocessing of (position, bytes), showing `on_decoded` (if any) each decoded image first."""

        def run(item: tuple[int, bytes]) -> np.ndarray:
            image = self.decode(item[1])
            if on_decoded is not None:
                on_decoded(item[0], image)
            return self.normalise(image)

        return run
