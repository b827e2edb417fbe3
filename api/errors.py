"""One error shape for every 4xx/5xx: `{"error": {"code": ..., "message": ...}}`.

Project errors (`CnclipError` subclasses) carry their own status and code. FastAPI's validation
errors and Starlette's HTTP errors (unknown route, wrong method) are rewritten into the same
shape. Anything else is a bug: it is logged with its traceback and the client sees a fixed
message, never the exception text.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from retrieval.errors import CnclipError, Overloaded, Unauthorized

log = logging.getLogger("cnclip.api")

# Codes for the HTTP errors Starlette raises itself.
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    429: "overloaded",
    503: "unavailable",
}


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The one JSON error body, with its status code."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _describe_validation(errors: Sequence[Any]) -> str:
    """`body.k: Input should be less than or equal to 200; ...` — field paths and pydantic's messages
    (which describe the rule, not the server), at most three."""
    parts = []
    for err in list(errors)[:3]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body" or len(err.get("loc", ())) == 1)
        msg = str(err.get("msg", "invalid value"))
        parts.append(f"{loc}: {msg}" if loc else msg)
    more = len(errors) - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


async def _cnclip_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CnclipError)
    headers = None
    if isinstance(exc, Overloaded):
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    elif isinstance(exc, Unauthorized):
        headers = {"WWW-Authenticate": "Bearer"}
    if exc.status_code >= 500:
        log.error("%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, exc.message)
    return error_response(exc.status_code, exc.code, exc.message, headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(422, "invalid_input", _describe_validation(exc.errors()))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    if exc.status_code == 404:
        message = f"no such route: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    elif exc.status_code >= 500:
        message = "internal server error"
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, code, message, dict(exc.headers) if exc.headers else None)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # A bug, not a user error: full traceback in the log, a fixed message to the client.
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "internal server error")


def install_error_handlers(app: FastAPI) -> None:
    """Route every error the app can produce into the one JSON shape."""
    app.add_exception_handler(CnclipError, _cnclip_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
