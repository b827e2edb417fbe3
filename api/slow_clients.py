"""The HTTP server's defence against slow and oversized request heads (slowloris).

uvicorn times out idle kept-alive connections, but not a client that opens a connection and sends
its request line and headers one byte at a time: such a connection is held open for ever, and a few
hundred of them exhaust the server. `guarded_protocol` returns uvicorn's httptools protocol with:

- a header read timeout: a request's line and headers must arrive within `header_timeout_s` of the
  connection opening (first request) or of the request's first byte (later requests on a kept-alive
  connection, whose idle wait is uvicorn's keep-alive timeout); otherwise the connection is closed;
- a cap on the request line + headers (`max_head_bytes`): more is answered 400 and closed;
- a whole-body deadline and size cap on every request, whether or not its route reads the body: a
  body still arriving `body_timeout_s` + 1 s after its headers, or longer than `max_body_bytes`, closes
  the connection. uvicorn reads (and discards) the body of a request the app has answered without
  reading it, for as long as it keeps coming, so an endless chunked body on `GET /healthz` held its
  connection for ever.

The app answers first where it reads the body: 408 at `body_timeout_s` (`api/request_guard.py`) and 413
over the app's cap (`api/limits.py`); the extra second here lets that answer go out before the close.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.config import Settings
from api.kserve_tensors import MAX_BODY_BYTES
from api.limits import FORM_OVERHEAD, max_request_bytes

MAX_HEAD_BYTES = 64 * 1024  # request line + headers; browsers send a few KB
BODY_GRACE_S = 1.0  # after the app's own body deadline, so that its 408 is sent before the close


class HeadTooLarge(Exception):
    """Raised inside the parser callback; httptools reports it and uvicorn answers 400 and closes."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head and body deadlines and size caps; `guarded_protocol`
    makes a subclass with the numbers set."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_body_bytes: int = 0
    max_head_bytes: int = MAX_HEAD_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_bytes = 0

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.logger.info("closing a connection whose request headers took over %.1f s", self.header_timeout_s)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        self._disarm_body_timer()
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
        if self._head_bytes > self.max_head_bytes:
            raise HeadTooLarge(f"request head over {self.max_head_bytes} bytes")

    def on_headers_complete(self) -> None:
        self._disarm_head_timer()
        self._body_bytes = 0
        if any(name in (b"content-length", b"transfer-encoding") for name, _ in self.headers):
            self._body_timer = self.loop.call_later(self.body_timeout_s + BODY_GRACE_S, self._body_timed_out)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.max_body_bytes:
            self._close(f"closing a connection whose request body went over {self.max_body_bytes:,} bytes")
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm_body_timer()
        super().on_message_complete()

    def _disarm_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timed_out(self) -> None:
        self._body_timer = None
        self._close(f"closing a connection whose request body took over {self.body_timeout_s + BODY_GRACE_S:g} s")

    def _close(self, reason: str) -> None:
        if not self.transport.is_closing():
            self.logger.info(reason)
            self.transport.close()


def guarded_protocol(
    header_timeout_s: float,
    body_timeout_s: float,
    max_body_bytes: int,
    max_head_bytes: int = MAX_HEAD_BYTES,
) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with head and body deadlines and size caps (pass as `http=`)."""
    limits = {
        "header_timeout_s": header_timeout_s,
        "body_timeout_s": body_timeout_s,
        "max_body_bytes": max_body_bytes,
        "max_head_bytes": max_head_bytes,
    }
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), limits)


def server_protocol(settings: Settings) -> type[asyncio.Protocol]:
    """The protocol `cnclip serve`, `cnclip worker` and the live test server run: the settings' deadlines,
    and a body cap above every cap an app answers with 413 (the /v2 bodies of a worker included)."""
    max_body = max(max_request_bytes(settings), MAX_BODY_BYTES) + FORM_OVERHEAD
    return guarded_protocol(settings.header_read_timeout_s, settings.body_read_timeout_s, max_body)
