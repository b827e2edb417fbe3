"""Types shared by every layer. Imports nothing of the project, so anything may import it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

TOWERS = ("image", "text")


@runtime_checkable
class Encoder(Protocol):
    """Turns texts and raw image bytes into L2-normalised float32 vectors of shape (n, dim).

    Implementations: the local ONNX Runtime encoder (buckets, streams, dynamic batcher), a
    remote Triton/KServe v2 encoder, and a deterministic fake for tests.
    """

    model_id: str
    dim: int
    logit_scale: float  # the multiplier applied to cosines, exp(logit_scale) of the checkpoint

    async def start(self) -> None:
        """Open sessions and warm every bucket; `ready` is True afterwards."""

    async def close(self) -> None:
        """Release sessions and fail whatever is still queued."""

    @property
    def ready(self) -> bool: ...

    async def embed_texts(self, texts: Sequence[str]) -> np.ndarray: ...

    async def embed_images(self, images: Sequence[bytes]) -> np.ndarray: ...

    async def embed_token_ids(self, ids: np.ndarray) -> np.ndarray:
        """Token ids int64 (n, context_length), already tokenized (the Triton/KServe v2 endpoint)."""

    async def embed_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """Preprocessed float32 (n, 3, R, R) images (the Triton/KServe v2 endpoint)."""


@runtime_checkable
class HealthChecked(Protocol):
    """An encoder that can stop answering after its start (a remote one): `/readyz` asks it, bounded in time."""

    async def check_health(self) -> None:
        """Return when it can embed now; raise `EncoderUnavailable` (saying why) when it cannot."""


@runtime_checkable
class EncoderObserver(Protocol):
    """Receives per-batch facts from an encoder's batcher (the API turns them into Prometheus metrics).

    `timings` has the keys "queue" (longest wait of the batch's items), "preprocess" (seconds spent
    decoding/tokenizing the batch's items), "inference" (the session run) and "post" (normalising and
    handing results back), all in seconds. `items` is the real rows; `bucket` the padded batch size.
    """

    def batch_done(self, tower: str, bucket: int, items: int, timings: dict[str, float]) -> None: ...
