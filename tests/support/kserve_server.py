"""A real uvicorn server on 127.0.0.1 (free port, background thread) around the KServe v2 router.

Used by tests/api/test_kserve.py and tests/retrieval/test_remote_encoder.py, so that tritonclient and the remote
encoder talk real HTTP to the router, exactly as they would to a Triton server.
"""

from __future__ import annotations

import asyncio
import io
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import numpy as np
import uvicorn
from fastapi import FastAPI
from PIL import Image

from api.config import Settings
from api.kserve import router

T = TypeVar("T")


def local_encoder(settings: Settings) -> Any:
    """The runtime's local encoder (buckets + batcher) on the settings' model."""
    from retrieval.encoder import LocalEncoder

    return LocalEncoder(settings)


def v2_app(encoder: Any, customise: Callable[[FastAPI], None] | None = None) -> FastAPI:
    """A minimal app: the v2 router and an encoder started by the lifespan. `customise` may add
    routes before the router's (they win), e.g. to make a model disappear."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        app.state.loop = asyncio.get_running_loop()
        await encoder.start()
        try:
            yield
        finally:
            await encoder.close()

    app = FastAPI(lifespan=lifespan)
    app.state.encoder = encoder
    app.state.settings = encoder.settings  # the API-key check reads it, as in api.app
    if customise is not None:
        customise(app)
    app.include_router(router)
    return app


class ServerThread:
    """uvicorn serving `app` in a thread; `url` is `127.0.0.1:port` (tritonclient's form)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on sockets that say they are TCP, and
        # without it Nagle + delayed ACKs add ~40 ms to every POST (as `uvicorn --host/--port` never does).
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()  # where the app's encoder lives (any app, not only v2_app)
        await self.server.serve(sockets=[self.sock])

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        """Run a coroutine on the server's event loop (where its encoder lives) and wait for it."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


def free_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def image_file(color: tuple[int, int, int], size: tuple[int, int] = (64, 48), fmt: str = "PNG") -> bytes:
    """A small noisy image of roughly `color`, encoded as `fmt`."""
    rng = np.random.default_rng(sum(color))
    pixels = (rng.random((size[1], size[0], 3)) * 60 + np.array(color) * 0.7).clip(0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()
