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

from api.slow_clients import guarded_protocol


class LiveServer:
    """`with LiveServer(app) as server:` serves `app` on `server.host`, `server.port`."""

    def __init__(self, app: Any, header_timeout_s: float = 10.0) -> None:
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
            http=guarded_protocol(header_timeout_s),
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
