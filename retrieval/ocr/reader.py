"""The OCR reader the indexing pipeline and uploads call: image bytes in, `RecognisedText` out, on its
own bounded thread pool, never failing a file.

- Input is bounded exactly as for CLIP: decoded by `retrieval.preprocess.decode_image` with the same
  byte and pixel limits (CNCLIP_MAX_IMAGE_BYTES, CNCLIP_MAX_IMAGE_PIXELS), EXIF-oriented.
- A photo that cannot be decoded or read is an image without text (an empty `RecognisedText`), never
  an error: the item is indexed and searchable by CLIP all the same.
- The engine loads on first use (a process without OCR collections never pays for it); if it cannot
  load, that is one log line, `read_many` answers None from then on (no text rows: `cnclip ocr` fills
  them later) and everything else works.
- `CNCLIP_OCR_THREADS` images are read at once, each on one ONNX Runtime thread: bounded, and apart
  from the CLIP streams' threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from retrieval.backends.base import SessionConfig
from retrieval.backends.onnxruntime import choose_provider
from retrieval.errors import EncoderUnavailable, InvalidImage, ModelError, PayloadTooLarge
from retrieval.ocr.engine import OcrEngine, RapidOcrEngine
from retrieval.ocr.types import RecognisedText
from retrieval.preprocess import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, decode_image

log = logging.getLogger(__name__)


def open_rapidocr(provider: str = "auto", device_id: int = 0) -> OcrEngine:
    """RapidOCR on the provider the CLIP sessions would choose for `provider` (CNCLIP_PROVIDER)."""
    device = choose_provider(provider)
    return RapidOcrEngine(SessionConfig(provider=device.name, precision="fp32", device_id=device_id, cores=[0]))


class OcrReader:
    """Reads text in image bytes with an engine opened on first use (see the module docstring)."""

    def __init__(
        self,
        open_engine: Callable[[], OcrEngine] = open_rapidocr,
        *,
        threads: int = 2,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        self._open_engine = open_engine
        self.threads = threads
        self.max_bytes = max_bytes
        self.max_pixels = max_pixels
        self._engine: OcrEngine | None = None
        self.failure: str | None = None  # why the engine could not load (logged once)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def engine(self) -> OcrEngine | None:
        """The engine, loading it the first time; None (and one log line, once) if it cannot load."""
        with self._lock:
            if self._engine is None and self.failure is None:
                try:
                    self._engine = self._open_engine()
                    log.info("OCR engine %s ready (%d threads)", self._engine.name, self.threads)
                except (ImportError, OSError, ModelError, EncoderUnavailable) as exc:
                    self.failure = f"{type(exc).__name__}: {exc}"
                    log.warning("OCR unavailable, images are indexed without their text: %s", self.failure)
            return self._engine

    def read(self, data: bytes) -> RecognisedText | None:
        """The text in one image (empty when it cannot be read); None when the engine is unavailable."""
        engine = self.engine()
        if engine is None:
            return None
        try:
            image = decode_image(data, self.max_bytes, self.max_pixels)
            return engine.read(image)
        except (InvalidImage, PayloadTooLarge) as exc:
            log.debug("OCR could not decode an image: %s", exc)
            return RecognisedText(engine=engine.name)
        except engine.errors as exc:
            log.debug("OCR could not read an image: %s", exc)
            return RecognisedText(engine=engine.name)

    async def read_many(self, images: Sequence[bytes]) -> list[RecognisedText] | None:
        """`read` for each image, `threads` at a time on the reader's own pool; None when unavailable."""
        if await asyncio.to_thread(self.engine) is None:
            return None
        pool = self._executor()
        loop = asyncio.get_running_loop()
        found = await asyncio.gather(*(loop.run_in_executor(pool, self.read, data) for data in images))
        return [text if text is not None else RecognisedText() for text in found]

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="cnclip-ocr")
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
