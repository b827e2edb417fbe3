"""The HTTP server's defence against slow and oversized request heads (slowloris).

uvicorn times out idle kept-alive connections, but not a client that opens a connection and sends
its request line and headers one byte at a time: such a connection is held open for ever, and a few
hundred of them exhaust the server. `guarded_protocol` returns uvicorn's httptools protocol with:

- a header read timeout: a request's line and headers must arrive within `header_timeout_s` of the
  connection opening (first request) or of the request's first byte (later requests on a kept-alive
  connection, whose idle wait is uvicorn's keep-alive timeout); otherwise the connection is closed;
- a cap on the request line + headers (`max_head_bytes`): more is answered 400 and closed.

The request *body* has its own deadline, enforced in the app (`api/request_guard.py`), because only
the app knows when it reads the body.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 64 * 1024  # request line + headers; browsers send a few KB


class HeadTooLarge(Exception):
    """Raised inside the parser callback; httptools reports it and uvicorn answers 400 and closes."""


def guarded_protocol(header_timeout_s: float, max_head_bytes: int = MAX_HEAD_BYTES) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with a header read timeout and a head size cap (pass as `http=`)."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_timer: asyncio.TimerHandle | None = None
            self._head_bytes = 0

        def _arm_head_timer(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _disarm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.logger.info("closing a connection whose request headers took over %.1f s", header_timeout_s)
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head_timer()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = 0
            self._arm_head_timer()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value))
            super().on_header(name, value)

        def _count(self, n: int) -> None:
            self._head_bytes += n
            if self._head_bytes > max_head_bytes:
                raise HeadTooLarge(f"request head over {max_head_bytes} bytes")

        def on_headers_complete(self) -> None:
            self._disarm_head_timer()
            super().on_headers_complete()

    return GuardedHttpToolsProtocol
