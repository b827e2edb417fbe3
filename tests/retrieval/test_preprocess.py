"""`retrieval.preprocess_image` against cn_clip's transform, and every kind of bad input."""

from __future__ import annotations

import io
import random
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile, ImageOps

import retrieval
from retrieval.errors import InvalidImage, PayloadTooLarge
from retrieval.manifest import CNCLIP_MEAN, CNCLIP_STD
from retrieval.preprocess import decode_image
from tests.support.crafted_images import encode, gradient, jpeg_of_scans, png_chunk, png_of_chunks


def cn_clip_transform(image: Image.Image, size: int = 224) -> np.ndarray:
    """cn_clip.clip.utils.image_transform, op for op as torchvision runs it on a PIL image:
    Resize((size, size), BICUBIC) → convert("RGB") → ToTensor → Normalize(mean, std)."""
    resized = image.resize((size, size), Image.Resampling.BICUBIC)  # torchvision's F.resize on PIL
    rgb = resized.convert("RGB")
    tensor = torch.from_numpy(np.array(rgb, dtype=np.uint8)).permute(2, 0, 1).contiguous().float().div(255)
    mean = torch.tensor(CNCLIP_MEAN).view(3, 1, 1)
    std = torch.tensor(CNCLIP_STD).view(3, 1, 1)
    return tensor.sub(mean).div(std).numpy()


def _cases() -> dict[str, bytes]:
    rgb = gradient(97, 61)
    rgba = rgb.copy()
    rgba.putalpha(Image.linear_gradient("L").resize(rgb.size))
    palette = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=32)
    palette_transparent = palette.copy()
    palette_transparent.info["transparency"] = 3
    frames = [gradient(40, 30, seed=s) for s in range(3)]
    animated = io.BytesIO()
    frames[0].save(animated, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    return {
        "rgb_png": encode(rgb, "PNG"),
        "rgb_jpeg": encode(rgb, "JPEG", quality=90),
        "rgba_png": encode(rgba, "PNG"),
        "la_png": encode(rgba.convert("LA"), "PNG"),
        "l_png": encode(rgb.convert("L"), "PNG"),
        "bilevel_png": encode(rgb.convert("1"), "PNG"),
        "p_png": encode(palette, "PNG"),
        "p_transparent_png": encode(palette_transparent, "PNG"),
        "cmyk_jpeg": encode(rgb.convert("CMYK"), "JPEG"),
        "webp": encode(rgb, "WEBP", lossless=True),
        "webp_rgba": encode(rgba, "WEBP"),
        "gif_animated": animated.getvalue(),
        "bmp": encode(rgb, "BMP"),
        "tiff": encode(rgb, "TIFF"),
        "tiff_rgba": encode(rgba, "TIFF", compression="tiff_lzw"),
        "one_pixel": encode(Image.new("RGB", (1, 1), (200, 10, 30)), "PNG"),
        "wide_4000x8": encode(gradient(4000, 8), "PNG"),
    }


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_cn_clip_transform(name: str) -> None:
    data = CASES[name]
    ours = retrieval.preprocess_image(data)
    assert ours.shape == (3, 224, 224) and ours.dtype == np.float32
    reference = cn_clip_transform(Image.open(io.BytesIO(data)))
    assert np.abs(ours - reference).max() <= 1e-5


def test_animation_uses_first_frame() -> None:
    first = gradient(40, 30, seed=0)
    expected = cn_clip_transform(Image.open(io.BytesIO(encode(first, "GIF"))))
    assert np.abs(retrieval.preprocess_image(CASES["gif_animated"]) - expected).max() <= 1e-5


def test_other_sizes_and_normalisation() -> None:
    ours = retrieval.preprocess_image(CASES["rgb_png"], size=336, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    resized = Image.open(io.BytesIO(CASES["rgb_png"])).resize((336, 336), Image.Resampling.BICUBIC)
    expected = (np.asarray(resized, np.float32).transpose(2, 0, 1) / 255 - 0.5) / 0.5
    assert ours.shape == (3, 336, 336) and np.abs(ours - expected).max() <= 1e-5


@pytest.mark.parametrize(
    ("mean", "std"),
    [(CNCLIP_MEAN, CNCLIP_STD), ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)), ((0.1, 0.9, 0.3), (0.07, 1.3, 0.21))],
)
def test_normalising_by_lookup_gives_the_bits_of_the_per_pixel_arithmetic(mean: tuple, std: tuple) -> None:
    """The values are looked up per byte (retrieval/preprocess.py `normalise`): every one of the 256
    values of every channel, and random pictures, give exactly what float32 x / 255 - mean, / std gives."""
    from retrieval.preprocess import normalise

    every_value = np.stack([np.arange(256, dtype=np.uint8)] * 3, axis=-1).reshape(16, 16, 3)
    pictures = [
        every_value,
        *(np.random.default_rng(seed).integers(0, 256, (224, 224, 3), np.uint8) for seed in range(3)),
    ]
    for rgb in pictures:
        side = rgb.shape[0]
        ours = normalise(Image.fromarray(rgb), size=side, mean=mean, std=std)
        pixels = rgb.astype(np.float32).transpose(2, 0, 1) / np.float32(255.0)
        expected = (pixels - np.asarray(mean, np.float32).reshape(3, 1, 1)) / np.asarray(std, np.float32).reshape(
            3, 1, 1
        )
        assert ours.dtype == np.float32 and ours.flags.c_contiguous
        assert np.array_equal(ours, expected)


def test_scans_are_counted_across_the_counting_chunks() -> None:
    """The FF DA pairs of a JPEG are counted a chunk at a time: a pair cut by a chunk's end still counts once."""
    from retrieval.preprocess import _count_pairs

    data = bytearray(b"\x00" * 40)
    for at in (0, 7, 15, 31, 38):  # 7: cut after FF at a chunk of 8; 15 and 31 likewise
        data[at : at + 2] = b"\xff\xda"
    data[20:23] = b"\xff\xff\xda"  # FF FF DA: one pair
    for chunk in (1, 2, 3, 8, 16, 1 << 20):
        assert _count_pairs(bytes(data), 0xFF, 0xDA, chunk=chunk) == 6
    assert _count_pairs(b"", 0xFF, 0xDA) == 0 and _count_pairs(b"\xff", 0xFF, 0xDA) == 0
    assert _count_pairs(memoryview(bytes(data)), 0xFF, 0xDA) == 6


def test_exif_orientation_is_applied() -> None:
    upright = gradient(80, 40)
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # what a camera writes with orientation 6
    exif = Image.Exif()
    exif[0x0112] = 6
    data = encode(stored, "JPEG", quality=95, exif=exif.tobytes())
    expected = cn_clip_transform(ImageOps.exif_transpose(Image.open(io.BytesIO(data))))
    assert np.abs(retrieval.preprocess_image(data) - expected).max() <= 1e-5
    assert decode_image(data).size == (80, 40)
    assert retrieval.probe_image(data) == ("image/jpeg", 80, 40)


def test_sixteen_bit_is_scaled_not_clipped() -> None:
    values = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 16).astype(np.uint16)  # 0 … 65520
    data = encode(Image.fromarray(values), "PNG")
    ours = retrieval.preprocess_image(data)
    eight_bit = Image.fromarray(np.rint(values / 65535 * 255).astype(np.uint8))
    assert np.abs(ours - cn_clip_transform(eight_bit)).max() <= 1e-5
    # Clipping would make almost every pixel white; scaling keeps the ramp.
    assert ours[0].min() < -1.5 and ours[0].max() > 1.5


def test_probe_reports_mime_and_size() -> None:
    assert retrieval.probe_image(CASES["rgb_png"]) == ("image/png", 97, 61)
    assert retrieval.probe_image(CASES["webp"]) == ("image/webp", 97, 61)
    assert retrieval.probe_image(CASES["gif_animated"]) == ("image/gif", 40, 30)
    with pytest.raises(InvalidImage):
        retrieval.probe_image(b"<html></html>")


def png_claiming(width: int, height: int) -> bytes:
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", header)
        + png_chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + png_chunk(b"IEND", b"")
    )


BAD_INPUTS = {
    "chunky_png_50001": png_of_chunks(50_001),
    "chunky_png_1700000": png_of_chunks(1_700_000),
    "jpeg_101_scans": jpeg_of_scans(101),
    "jpeg_20000_scans": jpeg_of_scans(20_000),
    "empty": b"",
    "truncated_png": CASES["rgb_png"][: len(CASES["rgb_png"]) // 2],
    "truncated_jpeg": CASES["rgb_jpeg"][: len(CASES["rgb_jpeg"]) // 3],
    "header_only_png": CASES["rgb_png"][:40],
    "text": "一张猫的照片, not an image".encode(),
    "html": b"<!doctype html><html><body><img src=x></body></html>",
    "svg": b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect/></svg>',
    "pdf": b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF",
    "eps": b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n",
    "random": bytes(random.Random(1).getrandbits(8) for _ in range(4096)),
    "png_60000x60000": png_claiming(60000, 60000),
    "png_9000x9000": png_claiming(9000, 9000),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_invalid_image_with_message(name: str) -> None:
    with pytest.raises(InvalidImage) as info:
        retrieval.preprocess_image(BAD_INPUTS[name])
    expected = "image_too_large" if name.startswith("png_") else "invalid_image"  # too large is not unreadable
    assert info.value.message and info.value.code == expected


def test_a_jpeg_of_more_scans_than_encoders_write_is_refused_at_its_header() -> None:
    """Decoding costs a pass over the image per scan: 100 scans (ten times libjpeg's) are decoded, one
    more is refused by the header check every route runs before decoding (retrieval.image_budget)."""
    from retrieval.preprocess import MAX_JPEG_SCANS, read_header

    assert MAX_JPEG_SCANS == 100
    assert retrieval.preprocess_image(jpeg_of_scans(100)).shape == (3, 224, 224)
    with pytest.raises(InvalidImage, match="101 scans"):
        read_header(jpeg_of_scans(101))
    assert read_header(CASES["rgb_jpeg"]).mime == "image/jpeg"  # baseline: one scan


def test_a_png_of_more_chunks_than_encoders_write_is_refused_before_pillow_walks_them() -> None:
    """Pillow steps over a PNG's chunks in Python when it opens one: 1.7 million empty chunks (20 MB,
    64×64 pixels) cost 9 s. 50,000 are read; one more is refused at once, before Pillow opens it."""
    import time

    from retrieval.preprocess import MAX_PNG_CHUNKS, read_header

    assert MAX_PNG_CHUNKS == 50_000
    assert retrieval.preprocess_image(png_of_chunks(50_000)).shape == (3, 224, 224)
    started = time.monotonic()
    with pytest.raises(InvalidImage, match="more than 50,000 chunks"):
        read_header(png_of_chunks(1_700_000), max_bytes=1 << 30)
    assert time.monotonic() - started < 1.0


def test_limits_are_configurable() -> None:
    with pytest.raises(PayloadTooLarge, match="limit is 100 bytes"):
        retrieval.preprocess_image(CASES["rgb_png"], max_bytes=100)
    with pytest.raises(InvalidImage, match="97×61 pixels"):
        retrieval.preprocess_image(CASES["rgb_png"], max_pixels=97 * 61 - 1)
    assert retrieval.preprocess_image(CASES["rgb_png"], max_pixels=97 * 61).shape == (3, 224, 224)
    with pytest.raises(InvalidImage, match="too many pixels|pixels; the limit"):
        retrieval.preprocess_image(BAD_INPUTS["png_60000x60000"])
    with pytest.raises(InvalidImage, match="expected image bytes"):
        retrieval.preprocess_image("not bytes")  # type: ignore[arg-type]


def _grey_png_header(width: int, height: int) -> bytes:
    """A PNG signature and IHDR claiming width×height, then one empty IDAT: enough for the header check."""

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(b""))
        + png_chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("size", [(1, 50_000_000), (50_000_000, 1), (65_536, 700)])
def test_each_side_is_capped_not_only_the_area(size: tuple[int, int]) -> None:
    """A 1×50,000,000 PNG is within the 50 M pixel cap but took 11 s to decode and resize, holding the GIL."""
    data = _grey_png_header(*size)
    with pytest.raises(InvalidImage, match="each side may be at most 65,535"):
        retrieval.probe_image(data)
    with pytest.raises(InvalidImage, match="each side may be at most 65,535"):
        retrieval.preprocess_image(data)
    assert retrieval.probe_image(_grey_png_header(65_535, 700))[1:] == (65_535, 700)  # the longest side allowed


@pytest.mark.parametrize(
    ("fmt", "rotated"), [("PNG", False), ("PNG", True), ("JPEG", True), ("WEBP", True), ("GIF", False), ("TIFF", False)]
)
def test_probe_decodes_no_pixels(monkeypatch: pytest.MonkeyPatch, fmt: str, rotated: bool) -> None:
    """The upload check reads headers only (a PNG without EXIF was decoded whole by getexif())."""
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90°: displayed as 48×64
    Image.new("RGB", (64, 48), (200, 30, 40)).save(buf, fmt, **({"exif": exif} if rotated else {}))

    def no_decoding(self: object) -> None:
        raise AssertionError("probe_image decoded pixels")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    mime, width, height = retrieval.probe_image(buf.getvalue())
    assert mime == Image.MIME[fmt]
    assert (width, height) == ((48, 64) if rotated else (64, 48))


def test_fuzz_random_and_mutated_bytes_only_raise_invalid_image() -> None:
    """Random blobs and bit-flipped/truncated real files: a result or InvalidImage, nothing else."""
    rng = random.Random(7)
    seeds = [CASES[n] for n in ("rgb_png", "rgb_jpeg", "gif_animated", "webp", "bmp", "tiff", "p_png")]
    blobs = [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 2048))) for _ in range(150)]
    for _ in range(250):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.getrandbits(8)
        if rng.random() < 0.5:
            data = data[: rng.randint(1, len(data))]
        blobs.append(bytes(data))
    outcomes = {"ok": 0, "invalid": 0}
    for blob in blobs:
        try:
            out = retrieval.preprocess_image(blob, max_pixels=4_000_000)
        except InvalidImage as exc:
            assert exc.message
            outcomes["invalid"] += 1
        else:
            assert out.shape == (3, 224, 224) and np.isfinite(out).all()
            outcomes["ok"] += 1
    assert outcomes["invalid"] >= 150  # every random blob at least
