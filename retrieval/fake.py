"""A deterministic encoder for tests and UI work: same input, same vector; no model needed.

Text vectors come from a hash of the text. Image vectors come from a hash of the bytes, so an
image searched with itself scores 1.0. Captions and pixels are unrelated: use the shipped demo
model where answers must mean something.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def _unit_vector(seed_bytes: bytes, dim: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(seed_bytes).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


class FakeEncoder:
    def __init__(self, dim: int = 32, model_id: str = "fake", logit_scale: float = 100.0) -> None:
        self.dim = dim
        self.model_id = model_id
        self.logit_scale = logit_scale
        self._ready = False
        self.calls: list[tuple[str, int]] = []  # (tower, batch size), for tests that count work

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        self._ready = True

    async def close(self) -> None:
        self._ready = False

    async def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(("text", len(texts)))
        return self.embed_texts_sync(texts)

    async def embed_images(self, images: Sequence[bytes]) -> np.ndarray:
        self.calls.append(("image", len(images)))
        return self.embed_images_sync(images)

    async def embed_token_ids(self, ids: np.ndarray) -> np.ndarray:
        """Vectors of token-id rows (n, context_length): a hash of each row's ids."""
        self.calls.append(("text", len(ids)))
        rows = np.asarray(ids, dtype=np.int64)
        return np.stack([_unit_vector(b"t" + row.tobytes(), self.dim) for row in rows]).reshape(-1, self.dim)

    async def embed_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """Vectors of preprocessed images (n, 3, R, R): a hash of each image's float32 bytes."""
        self.calls.append(("image", len(pixels)))
        rows = np.asarray(pixels, dtype=np.float32)
        return np.stack([_unit_vector(b"p" + row.tobytes(), self.dim) for row in rows]).reshape(-1, self.dim)

    def embed_texts_sync(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([_unit_vector(b"t" + t.encode("utf-8"), self.dim) for t in texts]).reshape(-1, self.dim)

    def embed_images_sync(self, images: Sequence[bytes]) -> np.ndarray:
        return np.stack([_unit_vector(b"i" + data, self.dim) for data in images]).reshape(-1, self.dim)
