"""The outermost guard of every HTTP request (an ASGI middleware):

- a request id: the client's `X-Request-ID` when it is short and plain, else a new one; it is
  echoed on every response and quoted in 5xx messages and the server log;
- a deadline for the request body (`body_timeout_s` from the first byte of the request): a client
  that trickles its body gets 408 instead of holding a worker for ever (the head has its own
  timeout in the HTTP server, see `api/slow_clients.py`);
- the catch-all: an exception nothing else handled becomes the project's 500 shape with the request
  id and no internals, is logged once with its traceback, and the connection stays usable. (An
  `Exception` handler would not do: Starlette answers it and then re-raises, so uvicorn logs a
  second traceback and drops the kept-alive connection.)
- security headers on every response: `X-Content-Type-Options: nosniff` and a Content Security
  Policy that allows only this server's own scripts, styles and images (the web UI needs nothing
  else); media files get a stricter one that forbids everything and sandboxes the document, so an
  image with a script appended can never run as a page.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

import anyio
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_response, public_message

log = logging.getLogger("cnclip.api")

APP_CSP = (
    "default-src 'self'; img-src 'self' blob: data:; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
# The API docs (api/docs.py) load only our own files and no inline script; ReDoc injects <style>
# elements, both draw icons from data: URLs, and ReDoc's search runs in a worker made from a blob: URL.
DOCS_CSP = (
    "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; worker-src 'self' blob:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
MEDIA_CSP = "default-src 'none'; sandbox"
DOCS_PATHS = ("/docs", "/redoc")
_MEDIA_PATH = re.compile(r"^/v1/items/[^/]+/(image|thumbnail)$")
_CLIENT_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def content_security_policy(path: str) -> str:
    """The CSP of a response to `path`."""
    if _MEDIA_PATH.match(path):
        return MEDIA_CSP
    if path.startswith(DOCS_PATHS):
        return DOCS_CSP
    return APP_CSP


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            if _CLIENT_ID.match(text):
                return text
    return uuid.uuid4().hex[:16]


class RequestGuardMiddleware:
    """Request id, body deadline, catch-all 500 and security headers (see the module docstring)."""

    def __init__(self, app: ASGIApp, body_timeout_s: float) -> None:
        self.app = app
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _request_id(scope)
        scope.setdefault("state", {})["request_id"] = rid
        csp = content_security_policy(scope["path"])
        deadline = time.monotonic() + self.body_timeout_s
        body_done = False
        started = False

        async def guarded_receive() -> Message:
            nonlocal body_done
            if body_done:  # after the body only a disconnect can come; waiting for it needs no deadline
                return await receive()
            try:
                with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                    message = await receive()
            except TimeoutError:
                # Starlette's HTTPException passes FastAPI's body parser untouched and becomes a 408.
                raise HTTPException(408, f"the request body did not arrive within {self.body_timeout_s:g} s") from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                headers["X-Request-ID"] = rid
                headers["X-Content-Type-Options"] = "nosniff"
                headers["Content-Security-Policy"] = csp
            await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except ClientDisconnect:
            # The client hung up before its body was read: no one to answer and nothing wrong here.
            log.info("client went away during %s %s [request %s]", scope["method"], scope["path"], rid)
        except Exception:
            log.exception("unhandled error on %s %s [request %s]", scope["method"], scope["path"], rid)
            if started:
                return  # half a response is out; the server closes the connection, nothing else to say
            response = error_response(500, "internal_error", public_message(500, "", rid))
            await response(scope, guarded_receive, guarded_send)
