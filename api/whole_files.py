"""The UI's own files (the page, the favicon, `/static`, `/static-docs`) are served whole, whatever
`Range` or `If-Range` a request carries.

They are a few kilobytes each, so ranges buy nothing, and Starlette answers a bad range on them in its
own words (a 400 of plain text for `bytes=5-1`, an empty 416 for `bytes=99999999999999999999-`) —
the only 4xx of this service without the error JSON shape. The media routes, whose files are large,
serve ranges themselves (api/media_response.py)."""

from __future__ import annotations

from starlette.responses import FileResponse
from starlette.types import ASGIApp, Receive, Scope, Send

_RANGE_HEADERS = (b"range", b"if-range")


def _without_ranges(scope: Scope) -> Scope:
    if scope["type"] != "http":
        return scope
    return {**scope, "headers": [(k, v) for k, v in scope["headers"] if k.lower() not in _RANGE_HEADERS]}


class WholeFiles:
    """An ASGI app (a `StaticFiles` mount) that never sees a request's range headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(_without_ranges(scope), receive, send)


class WholeFileResponse(FileResponse):
    """A `FileResponse` that sends the whole file, whatever range the request asked for."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(_without_ranges(scope), receive, send)
