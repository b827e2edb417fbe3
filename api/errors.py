"""One error shape for every 4xx/5xx: `{"error": {"code": ..., "message": ...}}`, and the one table
that maps the project's errors to HTTP statuses.

The model runtime and the storage layer raise `CnclipError` subclasses with a stable `code` and no
HTTP status; `STATUS_BY_ERROR` below decides the status (first matching class wins, so the most
specific classes come first). FastAPI's validation errors and Starlette's HTTP errors (unknown
route, wrong method) are rewritten into the same shape. A 5xx never carries the exception's own
text (paths, hosts, library messages): the log gets it, the client gets a fixed message and the
request id (`X-Request-ID`, see `api/request_guard.py`) to quote when reporting it.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.values import json_safe
from indexer.errors import (
    DatabaseUnavailable,
    GenerationMoved,
    MediaChanged,
    MigrationRefused,
    StorageFull,
    VectorStoreBusy,
    VectorStoreIncompatible,
    VectorStoreUnavailable,
)
from indexer.watch.health import WatcherDown
from retrieval.errors import (
    CnclipError,
    Conflict,
    EncoderUnavailable,
    InvalidInput,
    NotFound,
    Overloaded,
    PayloadTooLarge,
)

log = logging.getLogger("cnclip.api")


class Unauthorized(CnclipError):
    """A write (or, with `require_key_for_reads`, a read) without the right API key."""

    code = "unauthorized"


# Project error -> HTTP status. Most specific first: PayloadTooLarge is an InvalidInput.
class UnsupportedEncoding(CnclipError):
    """A request `Content-Encoding` other than gzip, deflate or identity: 415, as RFC 9110 says for an
    unsupported content coding (Triton answers 501; a client's choice is never a server fault here)."""

    code = "unsupported_encoding"


STATUS_BY_ERROR: tuple[tuple[type[CnclipError], int], ...] = (
    (Unauthorized, 401),
    (UnsupportedEncoding, 415),
    (PayloadTooLarge, 413),
    (InvalidInput, 422),
    (MediaChanged, 410),
    (NotFound, 404),
    (Conflict, 409),
    (MigrationRefused, 409),
    (GenerationMoved, 503),  # a search met a model swap twice in a row: retry
    (Overloaded, 429),
    (EncoderUnavailable, 503),
    (DatabaseUnavailable, 503),
    (WatcherDown, 503),  # /readyz: a folder watcher failed and waits to be restarted
    (VectorStoreIncompatible, 501),  # permanent: a retry cannot help, so never the 503 below
    (VectorStoreBusy, 503),
    (VectorStoreUnavailable, 503),
    (StorageFull, 507),  # nothing was stored; retrying helps only once someone frees space
    (CnclipError, 500),  # ModelError and anything else the project raises on purpose
)

# What a client sees of a 5xx: the cause stays in the server log.
_PUBLIC_5XX = {
    503: "the service is not ready (encoder warming up or unreachable, or database unavailable); retry in a moment",
    501: "this deployment cannot do that (a component, e.g. the Milvus server, does not support it); "
    "retrying will not help",
    507: "the server's storage is full; nothing was stored",
    500: "internal server error",
}

# Every 503 is a passing state (warming up, database or vector store away): clients retry after this.
UNAVAILABLE_RETRY_AFTER_S = 2

# Codes for the HTTP errors Starlette raises itself.
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    429: "overloaded",
    503: "unavailable",
    507: "storage_full",
}


def http_status(exc: CnclipError) -> int:
    """The HTTP status of a project error, from `STATUS_BY_ERROR`."""
    for cls, status in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return status
    return 500  # unreachable: CnclipError closes the table


def request_id(request: Request) -> str:
    """The id `RequestGuardMiddleware` gave this request ('-' outside the middleware, as in unit tests)."""
    return str(request.scope.get("state", {}).get("request_id", "-"))


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The one JSON error body, with its status code. The message may quote what a client sent: a lone
    surrogate in it is escaped, so that the answer can always be written (api/values.py)."""
    return JSONResponse({"error": {"code": code, "message": json_safe(message)}}, status_code=status, headers=headers)


def public_message(status: int, message: str, rid: str | None = None) -> str:
    """`message` for a 4xx; for a 5xx a fixed text (with the request id, when given) instead."""
    if status < 500:
        return message
    fixed = _PUBLIC_5XX.get(status, _PUBLIC_5XX[500])
    return f"{fixed} (request id {rid})" if rid else fixed


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


def retry_headers(exc: CnclipError) -> dict[str, str] | None:
    """`Retry-After` for an overloaded batcher and for every 503, `WWW-Authenticate` for a missing key."""
    if isinstance(exc, Overloaded):
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    if isinstance(exc, Unauthorized):
        return {"WWW-Authenticate": "Bearer"}
    if http_status(exc) == 503:
        return {"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)}
    return None


async def _cnclip_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CnclipError)
    status = http_status(exc)
    rid = request_id(request)
    if status >= 500:
        log.error(
            "%s %s failed [request %s]: %s: %s", request.method, request.url.path, rid, type(exc).__name__, exc.message
        )
    # An error written for clients (a degraded collection: it names the collection, never the cause).
    message = f"{exc.message} (request id {rid})" if getattr(exc, "public", False) else None
    return error_response(status, exc.code, message or public_message(status, exc.message, rid), retry_headers(exc))


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(422, "invalid_input", _describe_validation(exc.errors()))


def allowed_methods(app: Any, path: str) -> list[str]:
    """Every method the app serves at `path` (Starlette's 405 lists only the first route's)."""
    methods: set[str] = set()
    for template, ops in app.openapi().get("paths", {}).items():
        if re.fullmatch(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)), path):
            methods |= {m.upper() for m in ops}
    return sorted(methods)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    headers = dict(exc.headers) if exc.headers else {}
    path = request.url.path[:200]  # echoed back: bounded
    if status == 404:
        message = f"no such route: {request.method} {path}"
    elif status == 405:
        message = f"method {request.method} is not allowed on {path}"
        headers["Allow"] = ", ".join(allowed_methods(request.app, request.url.path)) or headers.get("Allow", "")
    elif status == 400:
        # FastAPI's "error parsing the body" (a body that is not UTF-8, say): invalid input like any other.
        status, message = 422, f"the request body cannot be parsed: {exc.detail}"
    else:
        message = public_message(status, str(exc.detail), request_id(request))
    code = _HTTP_CODES.get(status, "http_error")
    if status == 408:
        headers["Connection"] = "close"  # the rest of a trickled body would be read as the next request
    return error_response(status, code, message, headers or None)


def install_error_handlers(app: FastAPI) -> None:
    """Route every expected error into the one JSON shape. Unexpected exceptions are turned into
    the 500 shape by `RequestGuardMiddleware`, which (unlike an `Exception` handler, which Starlette
    re-raises after answering) keeps the connection usable and logs one traceback."""
    app.add_exception_handler(CnclipError, _cnclip_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
