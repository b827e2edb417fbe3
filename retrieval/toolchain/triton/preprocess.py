"""Triton Python-backend model `preprocess`: raw JPEG/PNG/... bytes → normalised float32 images.

`cnclip export-triton` copies this file to `<repo>/preprocess/1/model.py`. It runs inside Triton's
Python backend, where this project is not installed, so it imports only numpy and Pillow. It
repeats `retrieval.preprocess` exactly (tests compare the two): cn_clip's BICUBIC squash to
(size, size), RGB, /255, (x - mean) / std — not the BILINEAR resize of the seed's own example,
which silently changes the embeddings. `image_size`, `mean` and `std` come from the model's
manifest through the config's `parameters`.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
from PIL import Image, ImageOps

ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")
MAX_JPEG_SCANS = 100  # as retrieval.preprocess.MAX_JPEG_SCANS


class ImageRejected(ValueError):
    """Bytes that are not a usable image; reported to the client as a 400."""


def preprocess(
    data: bytes, size: int, mean: np.ndarray, std: np.ndarray, max_bytes: int, max_pixels: int
) -> np.ndarray:
    """One image file → float32 (3, size, size)."""
    if not data:
        raise ImageRejected("the image is empty (0 bytes)")
    if len(data) > max_bytes:
        raise ImageRejected(f"the image is {len(data):,} bytes; the limit is {max_bytes:,} bytes")
    try:
        image: Image.Image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
        width, height = image.size
        if width * height > max_pixels or width < 1 or height < 1:
            raise ImageRejected(f"the image is {width}×{height} pixels; the limit is {max_pixels:,} pixels")
        if data[:2] == b"\xff\xd8" and _scans(data) > MAX_JPEG_SCANS:  # each scan: a whole pass
            raise ImageRejected(f"the JPEG has more than {MAX_JPEG_SCANS} scans")
        image.seek(0)
        image.load()
        image = ImageOps.exif_transpose(image) or image
        if image.mode in SIXTEEN_BIT_MODES:
            array = np.asarray(image, dtype=np.float64)
            top = max(65535.0, float(array.max(initial=0)))
            image = Image.fromarray(np.clip(np.rint(array * (255.0 / top)), 0, 255).astype(np.uint8))
        resized = image.resize((size, size), Image.Resampling.BICUBIC).convert("RGB")
    except ImageRejected:
        raise
    except (OSError, ValueError, SyntaxError, EOFError, IndexError, KeyError, TypeError, ZeroDivisionError) as exc:
        # Pillow signals corrupt input with many exception types; all mean "not a usable image".
        raise ImageRejected(f"not a usable image: {exc}") from exc
    # Each byte value's result, looked up: the same float32 bits as x / 255 - mean, / std per pixel.
    table = (np.arange(256, dtype=np.float32) / np.float32(255.0) - mean.reshape(3, 1)) / std.reshape(3, 1)
    rgb = np.asarray(resized)
    pixels = np.empty((3, size, size), dtype=np.float32)
    for channel in range(3):
        np.take(table[channel], rgb[:, :, channel], out=pixels[channel])
    return pixels


def _scans(data: bytes, chunk: int = 1 << 20) -> int:
    """The FF DA pairs of a JPEG (at least its scans), a chunk of masks at a time, as retrieval.preprocess counts them."""
    array = np.frombuffer(data, dtype=np.uint8)
    count = 0
    for start in range(0, max(len(array) - 1, 0), chunk):
        window = array[start : start + chunk + 1]
        count += int(np.count_nonzero((window[:-1] == 0xFF) & (window[1:] == 0xDA)))
    return count


class TritonPythonModel:
    """The Python backend's entry point: one `image_bytes` BYTES [n] in, one `image` FP32 [n,3,R,R] out."""

    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.size = int(params["image_size"])
        self.mean = np.asarray(json.loads(params["mean"]), dtype=np.float32).reshape(3, 1, 1)
        self.std = np.asarray(json.loads(params["std"]), dtype=np.float32).reshape(3, 1, 1)
        self.max_bytes = int(params.get("max_image_bytes", 20 * 1024 * 1024))
        self.max_pixels = int(params.get("max_image_pixels", 50_000_000))

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils  # only exists inside Triton

        responses = []
        for request in requests:
            files = pb_utils.get_input_tensor_by_name(request, "image_bytes").as_numpy().reshape(-1)
            try:
                images = np.stack(
                    [
                        preprocess(bytes(f), self.size, self.mean, self.std, self.max_bytes, self.max_pixels)
                        for f in files
                    ]
                )
            except ImageRejected as exc:
                error = pb_utils.TritonError(f"image rejected: {exc}", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("image", images)]))
        return responses
