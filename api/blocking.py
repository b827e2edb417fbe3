"""Blocking work (SQL, FAISS, PIL, file I/O) goes through here, off the event loop."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread

T = TypeVar("T")


async def run_blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call in a worker thread (anyio's pool) and await its result."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
