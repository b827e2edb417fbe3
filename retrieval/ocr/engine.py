"""The OCR engine: RapidOCR 3 (PyPI `rapidocr`) with the PP-OCR detection, direction and recognition
models its wheel ships, on ONNX Runtime sessions this project opens itself.

Why these choices (issue 32): `rapidocr` does not depend on the `onnxruntime` wheel, so it runs on the
ONNX Runtime module installed here (`onnxruntime-cann`); `rapidocr-onnxruntime` would pull that wheel,
which overwrites the module (tests/retrieval/test_ocr_engine.py fails if a requirement says so). The
sessions are opened through the backend seam (retrieval/backends/onnxruntime.py: the provider chosen
as for the CLIP sessions, CPU by default, one intra-op thread each) and handed to RapidOCR, so it never
picks a provider, never opens a model itself and never reaches its download code: the model files
are the wheel's, by path. Recognition runs in the caller's thread; the sessions are shared by every
thread (ONNX Runtime sessions are thread-safe), each thread keeps its own RapidOCR pipeline object
(it keeps per-call state).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image

from retrieval.backends.base import SessionConfig
from retrieval.backends.onnxruntime import ort_errors, ort_providers, ort_session_options
from retrieval.errors import ModelError
from retrieval.ocr.types import RecognisedText, TextLine

# The wheel's models (rapidocr 3.10: PP-OCRv6 small detection and recognition, the v2 direction classifier).
MODEL_FILES = {
    "Det": "PP-OCRv6_det_small.onnx",
    "Cls": "ch_ppocr_mobile_v2.0_cls_mobile.onnx",
    "Rec": "PP-OCRv6_rec_small.onnx",
}
# Photos are scaled down to at most MAX_PIXELS (and MAX_SIDE, RapidOCR's own limit) before detection:
# its time grows with the pixels (a 2000×2000 photo took 3× a 1280×960 one), and text a person reads
# in a photo stays readable at 2 Mpx; a 50-Mpx photo never becomes a 150-MB array here.
MAX_PIXELS = 2_000_000
MAX_SIDE = 2000
# The detector sees the photo with its longer side at most DETECTION_MAX_SIDE (RapidOCR's default
# instead scales the shorter side *up* to 736 px: a 640×480 picture was detected at 981×736 and a
# 1280×960 photo at full size). Detection is most of the time, and it grows with the pixels: in one
# interleaved run (docs/ocr.md, Speed) a 1280×960 photo took 0.69 s at RapidOCR's default and
# 0.24 s at 736, every rendered sign and screenshot read alike, also small in a 12-Mpx photo. Boxes
# are mapped back and lines are recognised from the photo at its own size, so this bounds how small
# a text can be found (signs of 10-13 px at that size were), not how well it is read.
DETECTION_MAX_SIDE = 736
# RapidOCR's default shorter-side rule would scale a 1×5000 strip up to an 11-GB array, and its
# detector rounds each side to a multiple of 32 (a side under 16 px rounds to nothing): the reader
# pads the shorter side (right or bottom, so boxes keep their coordinates) until the sides are at most
# this ratio apart and the shorter one has at least MIN_SIDE pixels, whatever the detector's rule.
MAX_ASPECT = 4
MIN_SIDE = 32


class OcrEngine(Protocol):
    """Reads the text in one decoded image. Thread-safe; tests inject a fake."""

    name: str  # engine and version, stored with every text
    errors: tuple[type[BaseException], ...]  # what `read` raises for an image it cannot read

    def read(self, image: Image.Image) -> RecognisedText: ...


def rapidocr_version() -> str:
    return metadata.version("rapidocr")


def model_dir() -> Path:
    import rapidocr

    return Path(rapidocr.__file__).resolve().parent / "models"


class RapidOcrEngine:
    """`OcrEngine` over RapidOCR with sessions opened by `session_config` (provider, threads)."""

    def __init__(self, session_config: SessionConfig) -> None:
        import onnxruntime as ort

        directory = model_dir()
        self.name = f"rapidocr {rapidocr_version()} {MODEL_FILES['Rec'].removesuffix('.onnx')}"
        self.providers: list[str] = []
        self._sessions: dict[str, Any] = {}
        errors: tuple[type[BaseException], ...] = (RuntimeError, *ort_errors())
        for stage, file in MODEL_FILES.items():
            path = directory / file
            if not path.is_file():
                raise ModelError(f"the rapidocr wheel has no {file} (expected in {directory})")
            try:
                options = ort_session_options(session_config)
                # Detection sees a new input shape with every photo: an arena would keep the largest for good.
                options.enable_cpu_mem_arena = False
                session = ort.InferenceSession(str(path), sess_options=options, providers=ort_providers(session_config))
            except errors as exc:
                raise ModelError(f"cannot open OCR model {file}: {exc}") from exc
            self._sessions[stage] = session
            self.providers = list(session.get_providers())
        self._local = threading.local()
        self.errors = _rapidocr_errors()

    def _pipeline(self) -> Any:
        pipeline = getattr(self._local, "pipeline", None)
        if pipeline is None:
            from rapidocr import RapidOCR

            directory = model_dir()
            params: dict[str, Any] = {
                "Global.log_level": "error",
                "Global.model_root_dir": str(directory),
                "Det.limit_type": "max",
                "Det.limit_side_len": DETECTION_MAX_SIDE,
            }
            params.update({f"{stage}.model_path": str(directory / file) for stage, file in MODEL_FILES.items()})
            pipeline = RapidOCR(params=params)
            # RapidOCR's ONNX Runtime wrapper takes an open session from its stage's config
            # ("session"): ours, so it opens nothing itself. OmegaConf holds objects only when told.
            pipeline.cfg._set_flag("allow_objects", True)
            for stage, session in self._sessions.items():
                pipeline.cfg[stage].session = session
            self._local.pipeline = pipeline
        return pipeline

    def read(self, image: Image.Image) -> RecognisedText:
        """The lines RapidOCR finds in `image` (any mode; scaled down first, boxes in `image`'s pixels)."""
        scale = min(1.0, MAX_SIDE / max(image.size), (MAX_PIXELS / (image.width * image.height)) ** 0.5)
        if scale < 1.0:
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            image = image.resize(size, Image.Resampling.BILINEAR)
        bgr = np.ascontiguousarray(_padded(np.asarray(image.convert("RGB")))[:, :, ::-1])
        output = self._pipeline()(bgr)
        return RecognisedText(lines=_lines(output.txts, output.scores, output.boxes, scale), engine=self.name)


def _padded(rgb: np.ndarray) -> np.ndarray:
    """`rgb` with its shorter side padded (right or bottom, in its edge colour's mean) to within
    MAX_ASPECT of the longer one and to at least MIN_SIDE."""
    height, width = rgb.shape[:2]
    target_h = max(height, MIN_SIDE, -(-width // MAX_ASPECT))
    target_w = max(width, MIN_SIDE, -(-height // MAX_ASPECT))
    if (target_h, target_w) == (height, width):
        return rgb
    canvas = np.empty((target_h, target_w, 3), dtype=np.uint8)
    canvas[...] = rgb.reshape(-1, 3).mean(axis=0).astype(np.uint8)
    canvas[:height, :width] = rgb
    return canvas


def _rapidocr_errors() -> tuple[type[BaseException], ...]:
    """RapidOCR's own exceptions for inputs it cannot handle, OpenCV's and ONNX Runtime's, and the
    numpy errors its post-processing raises on degenerate detections."""
    import cv2
    from rapidocr.ch_ppocr_det.utils import ResizeImgError
    from rapidocr.inference_engine.onnxruntime.main import ONNXRuntimeError
    from rapidocr.main import RapidOCRError

    return (RapidOCRError, ResizeImgError, ONNXRuntimeError, cv2.error, ValueError, IndexError, *ort_errors())


def _lines(
    texts: Sequence[str] | None, scores: Sequence[float] | None, boxes: Any, scale: float
) -> tuple[TextLine, ...]:
    if not texts or scores is None or boxes is None:
        return ()
    found = []
    for text, score, box in zip(texts, scores, boxes, strict=False):
        if not text.strip():
            continue
        corners = tuple((round(float(x) / scale, 1), round(float(y) / scale, 1)) for x, y in np.asarray(box)[:4])
        found.append(TextLine(text=text, box=corners, score=round(float(score), 4)))  # type: ignore[arg-type]
    return tuple(found)
