"""A cap on request body size for the whole app, checked before a route reads anything.

Multipart uploads are spooled to disk by the form parser, so without this a client could make
the server write any amount of data before the per-file check in `uploads.read_upload` runs.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.config import Settings
from api.errors import error_response
from api.values import ascii_count
from retrieval.errors import PayloadTooLarge

FORM_OVERHEAD = 1 << 20  # room for multipart headers and the small form fields next to the file


def max_request_bytes(settings: Settings) -> int:
    """The largest request body the service takes: an image upload and its form."""
    return settings.max_image_bytes + FORM_OVERHEAD


class BodySizeLimitMiddleware:
    """413 when Content-Length (or the streamed body) exceeds `max_bytes`."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        length = ascii_count(declared.decode("latin-1")) if declared is not None else None
        if length is not None and length > self.max_bytes:
            message = f"the request body is larger than the limit of {self.max_bytes} bytes"
            if scope["path"] == "/v2" or scope["path"].startswith("/v2/"):
                response = JSONResponse({"error": message}, status_code=413)  # the KServe v2 error shape
            else:
                response = error_response(413, PayloadTooLarge.code, message)
            await response(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside the route's body read. Starlette's HTTPException passes FastAPI's body
                    # parser untouched (anything else becomes its 400 "error parsing the body").
                    raise HTTPException(413, f"the request body is larger than the limit of {self.max_bytes} bytes")
            return message

        await self.app(scope, counting_receive, send)
