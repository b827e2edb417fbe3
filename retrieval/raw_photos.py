"""Camera RAW files (DNG, CR2, CR3, NEF, ARW, RAF, ORF, RW2) for `retrieval/preprocess.py`, the one decoder.

A RAW is recognised by its content, never by its name: its own signature (CR3's `crx ` brand, RAF,
ORF, RW2, CR2's `CR` marker) or, for the TIFF-based ones, the first directory's tags (`DNGVersion`;
a camera `Make` with sub-directories or a reduced-resolution first image, as NEF and ARW have). A
scanner's TIFF is none of these and stays Pillow's.

LibRaw (through `rawpy`) reads the bytes already read and bounded (`open_buffer`: metadata only, no
pixel is unpacked), so the declared sensor size is checked against the pixel limits before anything
is decoded. Then the camera's embedded preview is used when it is large enough (`PREVIEW_MIN_SIDE`,
or at least the size a half-size demosaic would give): no demosaicing, a few milliseconds. Otherwise
a half-size demosaic with the camera's white balance. LibRaw's `flip` is the orientation; the date is
`DateTimeOriginal` (and `OffsetTimeOriginal`) of the TIFF container's EXIF directory, else of the
preview's EXIF (CR3, RAF).
"""

from __future__ import annotations

import io
import struct
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from retrieval.errors import ImageTooLarge, InvalidImage

# Long side (px) from which an embedded preview is used rather than demosaicing: more than twice the
# largest CN-CLIP input (336 px) and enough for the item page's rendition. A smaller preview is still
# used when it is at least as large as the half-size demosaic would be.
PREVIEW_MIN_SIDE = 1024

RAW_MIMES = {
    "DNG": "image/x-adobe-dng",
    "CR2": "image/x-canon-cr2",
    "CR3": "image/x-canon-cr3",
    "NEF": "image/x-nikon-nef",
    "ARW": "image/x-sony-arw",
    "RAF": "image/x-fuji-raf",
    "ORF": "image/x-olympus-orf",
    "RW2": "image/x-panasonic-rw2",
    "RAW": "image/x-dcraw",  # another camera's TIFF-based RAW
}
RAW_SUFFIXES = frozenset({".dng", ".cr2", ".cr3", ".nef", ".arw", ".raf", ".orf", ".rw2"})

_EXIF_IFD = 0x8769
_DATETIME_ORIGINAL = 0x9003
_OFFSET_TIME_ORIGINAL = 0x9011
_MAKE = 0x010F
_NEW_SUBFILE_TYPE = 0x00FE
_SUB_IFDS = 0x014A
_DNG_VERSION = 0xC612
# Kinds told from a TIFF's tags alone (a camera Make with sub-directories): when LibRaw cannot open
# one, it is read as the TIFF it also is (retrieval/preprocess.py).
GUESSED_KINDS = frozenset({"NEF", "ARW", "RAW"})
_TIFF = (b"II*\x00", b"MM\x00*")
_TIFF_LIKE = {b"IIRO": b"II*\x00", b"IIRS": b"II*\x00", b"MMOR": b"MM\x00*", b"IIU\x00": b"II*\x00"}
_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, IndexError, KeyError, TypeError, RuntimeError)


def _rawpy() -> Any:
    import rawpy  # noqa: PLC0415 (only files that are RAWs load LibRaw)

    return rawpy


def _tiff_directory(data: bytes) -> Image.Exif | None:
    """The first TIFF directory of `data` (ORF's and RW2's own magic read as TIFF); None if unreadable."""
    head = data[:4]
    if head in _TIFF_LIKE:
        data = _TIFF_LIKE[head] + data[4:]
    elif head not in _TIFF:
        return None
    exif = Image.Exif()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exif.load(data)
            exif.get(_MAKE)  # Pillow reads the directory lazily: a broken one fails here, not later
    except _ERRORS:
        return None
    return exif


def raw_kind(data: bytes) -> str | None:
    """The RAW kind ("DNG", "CR2", …) when `data` is a camera RAW (by content), else None."""
    head = bytes(data[:16])
    if head[4:12] == b"ftypcrx ":
        return "CR3"
    if head.startswith(b"FUJIFILMCCD-RAW"):
        return "RAF"
    if head[:4] in (b"IIRO", b"IIRS", b"MMOR"):
        return "ORF"
    if head[:4] == b"IIU\x00":
        return "RW2"
    if head[:4] not in _TIFF:
        return None
    if head[8:10] == b"CR":
        return "CR2"
    directory = _tiff_directory(data)
    if directory is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # odd tags are no camera's
            if _DNG_VERSION in directory:
                return "DNG"
            make = str(directory.get(_MAKE) or "").strip().upper()
            reduced = int(directory.get(_NEW_SUBFILE_TYPE) or 0) & 1
    except _ERRORS:
        return None
    if not make or not (reduced or _SUB_IFDS in directory):
        return None
    return "NEF" if make.startswith("NIKON") else "ARW" if make.startswith("SONY") else "RAW"


class RawUnreadable(InvalidImage):
    """LibRaw cannot open the file at all (not a RAW it knows, or broken before its metadata)."""


@dataclass(frozen=True)
class RawInfo:
    """What a RAW's metadata says, without unpacking a pixel."""

    kind: str
    mime: str
    width: int  # as displayed (LibRaw's flip applied)
    height: int
    flip: int  # LibRaw's: 0 none, 3 180°, 5 90° counter-clockwise, 6 90° clockwise
    date_original: object = None
    offset_original: object = None


def _open(data: bytes, max_pixels: int, max_side: int) -> tuple[Any, int, int, int]:
    """LibRaw on the bytes (metadata only): (raw, width, height, flip), sizes checked."""
    rawpy = _rawpy()
    try:
        raw = rawpy.imread(io.BytesIO(bytes(data)))
    except (rawpy.LibRawError, *_ERRORS) as exc:
        raise RawUnreadable(f"the camera RAW cannot be read: {_message(exc)}") from exc
    try:
        sizes = raw.sizes
        width, height, flip = int(sizes.width), int(sizes.height), int(sizes.flip)
        area = max(int(sizes.raw_width) * int(sizes.raw_height), width * height)
    except (rawpy.LibRawError, *_ERRORS) as exc:
        raw.close()
        raise InvalidImage(f"the camera RAW cannot be read: {_message(exc)}") from exc
    if width < 1 or height < 1:
        raw.close()
        raise InvalidImage(f"the camera RAW has no pixels ({width}×{height})")
    if area > max_pixels:
        raw.close()
        raise ImageTooLarge(f"the camera RAW is {width}×{height} pixels; the limit is {max_pixels:,} pixels")
    if max(width, height, int(sizes.raw_width), int(sizes.raw_height)) > max_side:
        raw.close()
        raise ImageTooLarge(f"the camera RAW is {width}×{height} pixels; each side may be at most {max_side:,}")
    if flip in (5, 6):
        width, height = height, width
    return raw, width, height, flip


def _message(exc: BaseException) -> str:
    text = exc.args[0] if exc.args else exc
    return text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text) or type(exc).__name__


def _dates(exif: Image.Exif | None) -> tuple[object, object]:
    if exif is None:
        return None, None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fields = exif.get_ifd(_EXIF_IFD)
        return fields.get(_DATETIME_ORIGINAL), fields.get(_OFFSET_TIME_ORIGINAL)
    except _ERRORS:
        return None, None


def _preview(raw: Any) -> tuple[str, Any] | None:
    """("jpeg", bytes) or ("bitmap", array) of the embedded preview; None when there is none."""
    rawpy = _rawpy()
    try:
        thumb = raw.extract_thumb()
    except (rawpy.LibRawError, *_ERRORS):
        return None
    if thumb.format == rawpy.ThumbFormat.JPEG:
        return "jpeg", bytes(thumb.data)
    return "bitmap", thumb.data


def read_raw(data: bytes, kind: str, max_pixels: int, max_side: int) -> RawInfo:
    """The `RawInfo` of a RAW (`raw_kind` said which), sizes checked; `InvalidImage` / `ImageTooLarge`."""
    raw, width, height, flip = _open(data, max_pixels, max_side)
    with raw:
        date, offset = _dates(_tiff_directory(data))
        if date is None:  # CR3, RAF: the preview's EXIF
            preview = _preview(raw)
            if preview is not None and preview[0] == "jpeg":
                date, offset = _dates(_jpeg_exif(preview[1]))
    return RawInfo(kind, RAW_MIMES[kind], width, height, flip, date, offset)


def _jpeg_exif(jpeg: bytes) -> Image.Exif | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Image.open(io.BytesIO(jpeg), formats=("JPEG",)).getexif()
    except (*_ERRORS, Image.DecompressionBombError):
        return None


@dataclass(frozen=True)
class RawPixels:
    """What `decode_raw` gives: the preview's JPEG bytes (decoded by the caller, with its limits), or
    an RGB image (a bitmap preview or the demosaic), and LibRaw's flip still to apply to the JPEG."""

    pixels: bytes | Image.Image  # the preview's JPEG bytes, or RGB pixels
    flip: int
    source: str  # "preview" or "demosaic"


def decode_raw(data: bytes, max_pixels: int, max_side: int, min_preview_side: int = PREVIEW_MIN_SIDE) -> RawPixels:
    """The pixels of a RAW: its embedded preview when large enough, else a half-size demosaic."""
    rawpy = _rawpy()
    raw, width, height, flip = _open(data, max_pixels, max_side)
    with raw:
        wanted = min(min_preview_side, (max(width, height) + 1) // 2)
        preview = _preview(raw)
        if preview is not None and preview[0] == "jpeg":
            size = _jpeg_size(preview[1])
            if size is not None and max(size) >= wanted:
                return RawPixels(preview[1], flip, "preview")
        elif preview is not None:
            array = np.asarray(preview[1])
            if array.ndim == 3 and array.shape[2] == 3 and array.dtype == np.uint8 and max(array.shape[:2]) >= wanted:
                return RawPixels(_flipped(Image.fromarray(array), flip), flip, "preview")
        try:
            rgb = raw.postprocess(half_size=True, use_camera_wb=True, output_bps=8)
        except (rawpy.LibRawError, MemoryError, *_ERRORS) as exc:
            raise InvalidImage(f"the camera RAW's data is corrupt or unsupported: {_message(exc)}") from exc
    return RawPixels(Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8)), flip, "demosaic")


def _jpeg_size(jpeg: bytes) -> tuple[int, int] | None:
    try:
        return Image.open(io.BytesIO(jpeg), formats=("JPEG",)).size
    except (*_ERRORS, Image.DecompressionBombError):
        return None


def _flipped(image: Image.Image, flip: int) -> Image.Image:
    """LibRaw's flip applied (the demosaic has it already; a preview has not)."""
    if flip == 3:
        return image.transpose(Image.Transpose.ROTATE_180)
    if flip == 5:
        return image.transpose(Image.Transpose.ROTATE_90)
    if flip == 6:
        return image.transpose(Image.Transpose.ROTATE_270)
    return image


def flipped(image: Image.Image, flip: int) -> Image.Image:
    """`_flipped` for the caller that decoded the preview JPEG."""
    return _flipped(image, flip)
