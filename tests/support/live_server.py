"""A real uvicorn server (the HTTP protocol `cnclip serve` uses) around a full app, in a thread.

For what only a real server shows: kept-alive connections after an error, slow clients, and a
frozen event loop (a TestClient runs one request at a time, so it cannot see one).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from api.config import Settings
from api.slow_clients import server_protocol


class LiveServer:
    """`with LiveServer(app) as server:` serves `app` on `server.host`, `server.port`, with the HTTP
    protocol `cnclip serve` runs, on the app's settings (`header_timeout_s` overrides theirs)."""

    def __init__(self, app: Any, header_timeout_s: float | None = None) -> None:
        settings: Settings = getattr(app.state, "settings", None) or Settings(_env_file=None)
        if header_timeout_s is not None:
            settings = settings.model_copy(update={"header_read_timeout_s": header_timeout_s})
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.host = "127.0.0.1"
        self.port = int(self.sock.getsockname()[1])
        self.base_url = f"http://{self.host}:{self.port}"
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=1,
            timeout_keep_alive=30,
            http=server_protocol(settings),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()
