"""The OCR engine (retrieval/ocr/): RapidOCR's wheel models on this project's ONNX Runtime sessions read
Chinese rendered onto photo-like pictures; nothing is downloaded; the `onnxruntime` module stays
onnxruntime-cann's; hostile input is bounded as for CLIP and gives an image without text; an engine that
cannot load is one log line and no text."""

from __future__ import annotations

import asyncio
import io
import logging
import platform
from collections.abc import Iterator
from importlib import metadata

import pytest
from PIL import Image

from retrieval.backends.base import SessionConfig
from retrieval.errors import ModelError
from retrieval.ocr.engine import DETECTION_MAX_SIDE, RapidOcrEngine, model_dir
from retrieval.ocr.reader import OcrReader, open_rapidocr
from tests.support.ocr_pictures import PICTURES, render_text_picture

CANN_PLATFORM = platform.system() == "Linux" and platform.machine() in ("x86_64", "aarch64")


def jpeg(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.convert("RGB").save(out, "JPEG", quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def reader() -> Iterator[OcrReader]:
    opened = OcrReader(threads=2)
    yield opened
    opened.close()


def test_rapidocr_does_not_require_the_onnxruntime_wheel() -> None:
    """`rapidocr-onnxruntime` (or any requirement on the `onnxruntime` distribution) would replace
    onnxruntime-cann's module with the CPU-only wheel, silently (pip check stays clean)."""
    requirements = metadata.requires("rapidocr") or []
    names = {r.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].split("!")[0].strip().lower()
             for r in requirements}  # fmt: skip
    assert "onnxruntime" not in names and not any(n.startswith("onnxruntime") for n in names), requirements
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.distribution("rapidocr-onnxruntime")


@pytest.mark.skipif(not CANN_PLATFORM, reason="onnxruntime-cann is the ONNX Runtime of Linux x86_64/aarch64 only")
def test_the_onnxruntime_module_is_onnxruntime_cann_s() -> None:
    """One distribution provides the `onnxruntime` module here, and it is onnxruntime-cann."""
    providers = metadata.packages_distributions().get("onnxruntime", [])
    assert sorted(set(providers)) == ["onnxruntime-cann"], providers
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.distribution("onnxruntime")


def test_the_engine_uses_the_wheel_models_and_never_downloads(monkeypatch: pytest.MonkeyPatch) -> None:
    import rapidocr.utils.download_file as download

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("rapidocr tried to download a model")

    monkeypatch.setattr(download.DownloadFile, "run", staticmethod(refuse))
    engine = RapidOcrEngine(SessionConfig(provider="cpu", precision="fp32", cores=[0]))
    assert engine.providers == ["CPUExecutionProvider"]
    found = engine.read(render_text_picture(PICTURES[0]))
    assert "北京烤鸭" in found.text
    assert (model_dir() / "PP-OCRv6_rec_small.onnx").is_file()
    assert engine.name.startswith(f"rapidocr {metadata.version('rapidocr')}")


@pytest.mark.parametrize("picture", PICTURES[:2] + PICTURES[5:6], ids=lambda p: p.name)
def test_reads_rendered_chinese_signs_and_screenshots(reader: OcrReader, picture) -> None:
    found = reader.read(jpeg(render_text_picture(picture)))
    assert found is not None
    compact = "".join(found.text.split())
    for line in picture.lines:
        assert "".join(line.split()) in compact, (line, found.text)
    assert all(0.5 <= line.score <= 1.0 for line in found.lines)
    for line in found.lines:  # boxes in the picture's pixels
        assert all(-2 <= x <= 642 and -2 <= y <= 482 for x, y in line.box), line.box


def test_boxes_are_in_the_pixels_of_a_photo_scaled_down_for_reading(reader: OcrReader) -> None:
    big = render_text_picture(PICTURES[0]).resize((2560, 1920))  # 4.9 Mpx: read at 2 Mpx
    found = reader.read(jpeg(big))
    assert found is not None and "北京烤鸭" in found.text
    xs = [x for line in found.lines for x, _ in line.box]
    assert max(xs) > 640  # scaled back to the photo, not the reading size


def test_a_small_sign_in_a_camera_photo_is_found_at_the_detectors_size(reader: OcrReader) -> None:
    """Detection sees at most DETECTION_MAX_SIDE pixels a side (its speed): a sign whose characters are
    54-70 px tall in a 4000×3000 photo (10-13 px at that size) is still found, and read from the
    photo itself."""
    photo = Image.new("RGB", (4000, 3000), (90, 110, 100))
    photo.paste(render_text_picture(PICTURES[1]), (1700, 1300))
    assert max(photo.size) / DETECTION_MAX_SIDE > 5
    found = reader.read(jpeg(photo))
    assert found is not None and "安全出口B" in "".join(found.text.split()), found.text
    xs = [x for line in found.lines for x, _ in line.box]
    assert min(xs) >= 1690 and max(xs) <= 2350  # boxes in the photo's pixels, around the sign


def test_a_picture_without_text_has_none(reader: OcrReader) -> None:
    found = reader.read(jpeg(Image.new("RGB", (640, 480), (90, 140, 200))))
    assert found is not None and found.text == "" and found.lines == ()


@pytest.mark.parametrize(
    "data",
    [
        b"not an image at all",
        jpeg(render_text_picture(PICTURES[0]))[:3000],  # truncated
        jpeg(Image.new("RGB", (1, 1))),
        jpeg(Image.new("RGB", (2, 4000))),  # a strip: padded to 1:MAX_ASPECT, never an 11-GB array
    ],
    ids=["not-an-image", "truncated", "one-pixel", "strip"],
)
def test_unreadable_input_is_an_image_without_text(reader: OcrReader, data: bytes) -> None:
    found = reader.read(data)
    assert found is not None and found.text == ""


def test_input_is_bounded_as_for_clip() -> None:
    """The byte and pixel limits are the encoder's (CNCLIP_MAX_IMAGE_BYTES / _PIXELS): over them, no text."""
    calls = []

    class Counting:
        name, errors = "counting", ()

        def read(self, image: Image.Image):
            calls.append(image.size)
            raise AssertionError("an image over the limits was decoded")

    small = OcrReader(lambda: Counting(), threads=1, max_pixels=100_000, max_bytes=10_000_000)  # type: ignore[arg-type,return-value]
    found = small.read(jpeg(Image.new("RGB", (400, 300))))  # 120 000 pixels
    assert found is not None and found.text == "" and calls == []
    tiny = OcrReader(lambda: Counting(), threads=1, max_bytes=100)  # type: ignore[arg-type,return-value]
    assert tiny.read(jpeg(Image.new("RGB", (40, 30)))).text == ""  # type: ignore[union-attr]


def test_an_engine_that_cannot_load_is_one_log_line_and_no_text(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> RapidOcrEngine:
        raise ModelError("no models here")

    failing = OcrReader(broken, threads=1)
    with caplog.at_level(logging.WARNING, logger="retrieval.ocr.reader"):
        assert failing.read(b"x") is None
        assert asyncio.run(failing.read_many([b"x", b"y"])) is None
        assert failing.engine() is None
    lines = [r for r in caplog.records if r.name == "retrieval.ocr.reader"]
    assert len(lines) == 1 and "no models here" in lines[0].getMessage()
    assert failing.failure is not None


def test_an_explicit_provider_that_is_absent_is_a_load_failure() -> None:
    failing = OcrReader(lambda: open_rapidocr("cuda"), threads=1)
    assert failing.engine() is None and "CUDA" in (failing.failure or "").upper()


def test_read_many_runs_on_the_reader_s_own_bounded_threads(reader: OcrReader) -> None:
    pictures = [jpeg(render_text_picture(p)) for p in PICTURES[2:4]]
    found = asyncio.run(reader.read_many(pictures))
    assert found is not None and len(found) == 2
    assert "会议室" in found[0].text and "禁止吸烟" in found[1].text
    assert reader._pool is not None and reader._pool._max_workers == 2
