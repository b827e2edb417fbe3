"""A deterministic OCR engine for the tests that are about storage, the pipeline and the commands rather
than recognition (tests/retrieval/test_ocr_engine.py reads real pictures with the real engine): it
"reads" the text a PNG carries in its `ocr` text chunk, one line per "\\n", and counts its calls."""

from __future__ import annotations

import io
import threading

from PIL import Image, PngImagePlugin

from retrieval.ocr.reader import OcrReader
from retrieval.ocr.types import RecognisedText, TextLine


class FakeOcrEngine:
    name = "fake-ocr 1"
    errors: tuple[type[BaseException], ...] = (ValueError,)

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def read(self, image: Image.Image) -> RecognisedText:
        with self._lock:
            self.calls += 1
        text = str(image.info.get("ocr", ""))
        if text == "UNREADABLE":
            raise ValueError("the engine cannot read this one")
        lines = tuple(
            TextLine(line, ((0.0, 10.0 * n), (50.0, 10.0 * n), (50.0, 10.0 * n + 9), (0.0, 10.0 * n + 9)), 0.99)
            for n, line in enumerate(text.split("\n"))
            if line
        )
        return RecognisedText(lines=lines, engine=self.name)


def fake_reader(engine: FakeOcrEngine | None = None, threads: int = 2) -> OcrReader:
    engine = engine or FakeOcrEngine()
    return OcrReader(lambda: engine, threads=threads)


def png_with_text(text: str, seed: int = 0, size: tuple[int, int] = (64, 48)) -> bytes:
    """A small PNG (distinct bytes per `seed`) whose `ocr` chunk the fake engine reads."""
    info = PngImagePlugin.PngInfo()
    info.add_text("ocr", text)
    out = io.BytesIO()
    Image.new("RGB", size, (seed % 256, (seed * 7) % 256, (seed * 13) % 256)).save(out, "PNG", pnginfo=info)
    return out.getvalue()
