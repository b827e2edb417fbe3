"""Work for a client that is still there: a request of many images whose client goes away stops,
and the images it has not started decoding are dropped (retrieval/fair_pool.py), instead of running
for nobody.

Once a request's body has been read, the only message the server can still receive for it is
`http.disconnect`; `while_connected` waits for that beside the work and cancels the work when it
comes first. Starlette does not do this by itself: a handler runs to its end whoever is listening.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request, Response

T = TypeVar("T")

# nginx's "client closed request": the client never sees it; the access log and the statistics do.
CLIENT_CLOSED = 499


class ClientGone(Exception):
    """The client disconnected before the work was done; the work was cancelled."""


def client_gone_response() -> Response:
    """What a route answers to nobody when `ClientGone` is raised."""
    return Response(status_code=CLIENT_CLOSED)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def while_connected(request: Request, work: Awaitable[T]) -> T:
    """`await work`, cancelled (and `ClientGone` raised) if the client disconnects first. Call it only
    after the request's body has been read in full."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request itself was cancelled
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait({task})  # let it drop what it queued; its own outcome no longer matters
    if not task.cancelled():
        task.exception()  # read, so that asyncio does not log it as never retrieved
    raise ClientGone("the client disconnected before the answer was ready")
