"""The two helpers every async use case shares: a blocking call run off the event loop (anyio's
worker threads, as the API's own `run_blocking`), and the warm-encoder check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread

from retrieval.errors import EncoderUnavailable
from retrieval.types import Encoder

T = TypeVar("T")


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call (SQL, the engine, PIL) in a worker thread and await its result."""
    return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))


def warm(encoder: Encoder | None) -> Encoder:
    """The model, warm (a request before the warm-up ends, or after a shutdown began, is a 503)."""
    if encoder is None or not encoder.ready:
        raise EncoderUnavailable("the model is not loaded yet; retry in a moment")
    return encoder
