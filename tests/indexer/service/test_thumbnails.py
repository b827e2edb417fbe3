"""Thumbnails show what the model saw: for every mode the preprocessing accepts, the thumbnail's
colours (per quadrant) and orientation equal those of the preprocessed 224×224 image."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from api.config import Settings
from indexer.service.thumbnails import THUMBNAIL_SIZE, save_thumbnail
from retrieval.manifest import CNCLIP_MEAN, CNCLIP_STD
from retrieval.preprocess import preprocess_image
from tests.support.api_helpers import api_client

# Four quadrant colours (top-left, top-right, bottom-left, bottom-right), far apart from each other.
QUADRANTS = [(200, 30, 40), (40, 110, 220), (60, 170, 60), (240, 220, 30)]
W, H = 160, 96  # landscape, so a rotation shows in the thumbnail's shape


def quadrant_image(mode: str = "RGB", colours: list[tuple[int, ...]] | None = None) -> Image.Image:
    img = Image.new(mode, (W, H))
    for (x, y), colour in zip([(0, 0), (1, 0), (0, 1), (1, 1)], colours or QUADRANTS, strict=True):
        img.paste(colour, (x * W // 2, y * H // 2, (x + 1) * W // 2, (y + 1) * H // 2))
    return img


def save(img: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def sixteen_bit_png() -> bytes:
    # Greyscale I;16 quadrants well above 255: clipped to 8 bits they would all be white.
    img = Image.fromarray(
        np.kron(np.array([[9000, 24000], [40000, 60000]], dtype=np.uint16), np.ones((H // 2, W // 2), dtype=np.uint16))
    )
    assert img.mode == "I;16"
    return save(img, "PNG")


def sixteen_bit_tiff() -> bytes:
    img = Image.fromarray(
        np.kron(np.array([[60000, 9000], [24000, 40000]], dtype=np.uint16), np.ones((H // 2, W // 2), dtype=np.uint16))
    )
    return save(img, "TIFF")


def cmyk_jpeg() -> bytes:
    img = quadrant_image("CMYK", [(0, 200, 190, 40), (200, 100, 0, 20), (150, 0, 160, 60), (0, 20, 220, 10)])
    return save(img, "JPEG", quality=95)


def palette_png_with_transparency() -> bytes:
    img = quadrant_image("RGB").quantize(colors=8)
    transparent = img.getpixel((0, 0))  # the top-left quadrant is fully transparent
    return save(img, "PNG", transparency=transparent)


def rgba_png() -> bytes:
    img = quadrant_image("RGB").convert("RGBA")
    img.putalpha(Image.new("L", (W, H), 90))
    return save(img, "PNG")


def exif_rotated_jpeg(orientation: int) -> Callable[[], bytes]:
    def make() -> bytes:
        exif = Image.Exif()
        exif[0x0112] = orientation
        return save(quadrant_image(), "JPEG", quality=95, exif=exif.tobytes())

    return make


CASES: dict[str, Callable[[], bytes]] = {
    "rgb-jpeg": lambda: save(quadrant_image(), "JPEG", quality=95),
    "progressive-jpeg": lambda: save(quadrant_image(), "JPEG", quality=95, progressive=True),
    "greyscale-jpeg": lambda: save(quadrant_image().convert("L"), "JPEG", quality=95),
    "cmyk-jpeg": cmyk_jpeg,
    "16-bit-png": sixteen_bit_png,
    "16-bit-tiff": sixteen_bit_tiff,
    "palette-png-transparent": palette_png_with_transparency,
    "rgba-png": rgba_png,
    "la-png": lambda: save(quadrant_image().convert("LA"), "PNG"),
    "bilevel-png": lambda: save(quadrant_image().convert("1"), "PNG"),
    "webp": lambda: save(quadrant_image(), "WEBP", lossless=True),
    "gif": lambda: save(quadrant_image().quantize(colors=8), "GIF"),
    "bmp": lambda: save(quadrant_image(), "BMP"),
    "tiff": lambda: save(quadrant_image(), "TIFF"),
    "exif-rotate-90-cw": exif_rotated_jpeg(6),
    "exif-rotate-180": exif_rotated_jpeg(3),
    "exif-mirror-transpose": exif_rotated_jpeg(5),
}


def model_view(data: bytes) -> np.ndarray:
    """The preprocessed image back in 0..255 RGB, (224, 224, 3)."""
    chw = preprocess_image(data)
    mean = np.asarray(CNCLIP_MEAN, dtype=np.float32).reshape(3, 1, 1)
    std = np.asarray(CNCLIP_STD, dtype=np.float32).reshape(3, 1, 1)
    return ((chw * std + mean) * 255.0).transpose(1, 2, 0)


def quadrant_means(rgb: np.ndarray) -> np.ndarray:
    """Mean colour of the central half of each quadrant (away from the edges that resampling blurs)."""
    h, w = rgb.shape[:2]
    out = []
    for y in (0, 1):
        for x in (0, 1):
            y0, x0 = y * h // 2 + h // 8, x * w // 2 + w // 8
            out.append(rgb[y0 : y0 + h // 4, x0 : x0 + w // 4].reshape(-1, 3).mean(axis=0))
    return np.stack(out)


@pytest.mark.parametrize("case", list(CASES))
def test_thumbnail_colours_equal_the_preprocessed_image(case: str, tmp_path: Path) -> None:
    data = CASES[case]()
    target = tmp_path / "thumbs" / "t.jpg"
    assert save_thumbnail(data, target) == target.read_bytes()
    with Image.open(target) as thumb:
        assert thumb.format == "JPEG" and thumb.mode == "RGB"
        # Oriented as displayed: the EXIF transposes (5-8) turn the landscape source portrait.
        rotated = case in ("exif-rotate-90-cw", "exif-mirror-transpose")
        assert thumb.size == ((H, W) if rotated else (W, H))  # smaller than THUMBNAIL_SIZE: not upscaled
        squashed = np.asarray(thumb.resize((224, 224), Image.Resampling.BICUBIC), dtype=np.float32)
    expected = quadrant_means(model_view(data))
    got = quadrant_means(squashed)
    assert np.abs(got - expected).max() < 10, f"thumbnail {got.round()} vs model view {expected.round()}"
    # The four quadrants differ (not one flat colour, as a 16-bit PNG clipped to white would be).
    assert np.ptp(expected, axis=0).max() > 40


def test_large_images_are_scaled_to_the_thumbnail_size(tmp_path: Path) -> None:
    jpeg = save_thumbnail(save(quadrant_image().resize((2000, 1200)), "JPEG", quality=90), tmp_path / "t.jpg")
    with Image.open(io.BytesIO(jpeg)) as thumb:
        assert thumb.size == (THUMBNAIL_SIZE, THUMBNAIL_SIZE * 1200 // 2000)
        got = quadrant_means(np.asarray(thumb.resize((224, 224)), dtype=np.float32))
    assert np.abs(got - np.asarray(QUADRANTS, dtype=np.float32)).max() < 10


def test_a_16_bit_png_uploaded_through_the_api_has_a_true_thumbnail(settings: Settings) -> None:
    data = sixteen_bit_png()
    with api_client(settings) as c:
        assert c.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        r = c.post("/v1/collections/photos/items", files={"file": ("deep.png", data, "image/png")})
        assert r.status_code == 201, r.text
        thumb = c.get(f"/v1/items/{r.json()['id']}/thumbnail")
    assert thumb.status_code == 200
    with Image.open(io.BytesIO(thumb.content)) as img:
        got = quadrant_means(np.asarray(img.convert("RGB").resize((224, 224)), dtype=np.float32))
    grey = [round(v * 255 / 65535) for v in (9000, 24000, 40000, 60000)]
    assert np.abs(got - np.asarray(grey, dtype=np.float32)[:, None]).max() < 6
