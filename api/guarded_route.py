"""The route class of every /v1 router: the API key before the body, and JSON bodies within a budget.

FastAPI reads and parses a route's body *before* it solves the route's dependencies, so without this a
request with no key would have its whole body read (and parsed: 200k keys cost seconds) before the
key check refused it, and the parse would run on the event loop. `GuardedRoute` runs, in order:

1. the route's own API-key dependencies (`require_read_key` / `require_write_key`, as the route
   declares them; they run again, cheaply, where FastAPI solves them): 401 before any body byte is read;
2. for a JSON body: reads it within the budget its schema declares (`max_body_bytes`,
   `max_json_values` on `api.schemas.StrictModel`), counted while it arrives (api/body_budget.py),
   then parses it (in a worker thread unless it is small); FastAPI finds it parsed and validates it;
3. once FastAPI has validated the route's arguments, every one taken from the request (query, path,
   header, form and body fields, uploads' file names) passes the value rules of `api/values.py`
   (texts, datetimes, numbers) before the route runs: 422 naming the field otherwise.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response, params
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from api.blocking import run_blocking
from api.body_budget import INLINE_PARSE_BYTES, BodyBudget, read_within
from api.deps import require_read_key, require_write_key
from api.schemas import StrictModel
from api.values import check_arguments
from retrieval.errors import InvalidInput
from retrieval.json_text import JSONNumberRefused, JSONTooDeep, loads

_KEY_CHECKS = (require_write_key, require_read_key)
DEFAULT_BUDGET = BodyBudget(StrictModel.max_body_bytes, StrictModel.max_json_values)


def _is_json(content_type: str | None, strict: bool) -> bool:
    """FastAPI's rule for parsing a body as JSON: application/json or application/*+json, or (when the
    route's content type is not strict) no content type at all."""
    if not content_type:
        return not strict
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


_UNPARSED = object()


def _parse_json(body: bytes) -> Any:
    try:
        return loads(body)
    except JSONTooDeep as exc:
        # FastAPI's own parse would hit the same recursion limit, as an unhandled RecursionError.
        raise InvalidInput("the JSON body is nested too deeply") from exc
    except JSONNumberRefused as exc:
        # FastAPI's own parse would take NaN and fail on 5000 digits: answer in the number rule's words.
        raise InvalidInput(f"the JSON body {exc.msg}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _UNPARSED  # FastAPI parses it again and answers in its own words


def request_sources(dependant: Dependant) -> dict[str, str]:
    """Argument name -> where FastAPI takes it from (query, path, header, cookie, body), for the
    arguments of a route that come from the request (not its dependencies' results)."""
    groups = {
        "query": dependant.query_params,
        "path": dependant.path_params,
        "header": dependant.header_params,
        "cookie": dependant.cookie_params,
        "body": dependant.body_params,
    }
    return {field.name: source for source, fields in groups.items() for field in fields}


def _checking_values(endpoint: Callable[..., Any], sources: dict[str, str]) -> Callable[..., Any]:
    """`endpoint`, running `check_arguments` on its request's arguments first. FastAPI reads the
    signature (and resolves its annotations) through `__wrapped__`, so the route is unchanged."""
    endpoint = getattr(endpoint, "__checked_endpoint__", endpoint)  # a route copied by include_router
    if inspect.iscoroutinefunction(endpoint):

        @functools.wraps(endpoint)
        async def checked(**values: Any) -> Any:
            check_arguments(values, sources)
            return await endpoint(**values)

    else:

        @functools.wraps(endpoint)
        def checked(**values: Any) -> Any:
            check_arguments(values, sources)
            return endpoint(**values)

    checked.__checked_endpoint__ = endpoint  # type: ignore[attr-defined]
    return checked


class GuardedRoute(APIRoute):
    """An APIRoute that checks the API key first, reads JSON bodies within their budget and holds the
    values its request carries to the rules of `api/values.py`."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        sources: dict[str, str] = {}
        super().__init__(path, _checking_values(endpoint, sources), **kwargs)
        sources.update(request_sources(self.dependant))

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        checks = [d.dependency for d in self.dependencies if d.dependency in _KEY_CHECKS]
        budget = self._json_budget()
        strict = self.strict_content_type
        strict = bool(strict.value if isinstance(strict, DefaultPlaceholder) else strict)

        async def guarded(request: Request) -> Response:
            for check in checks:
                await check(request)  # type: ignore[misc]
            if budget is not None:
                body = await read_within(request.stream(), budget)
                request._body = body  # Starlette's cache: FastAPI's `await request.body()` returns it
                if body and _is_json(request.headers.get("content-type"), strict):
                    small = len(body) <= INLINE_PARSE_BYTES  # quicker than the hop to a worker thread
                    parsed = _parse_json(body) if small else await run_blocking(_parse_json, body)
                    if parsed is not _UNPARSED:
                        request._json = parsed  # likewise for `await request.json()`
            return await handler(request)

        return guarded

    def _json_budget(self) -> BodyBudget | None:
        """The budget of this route's JSON body; None for routes without one (or with a form body)."""
        if self.body_field is None or isinstance(self.body_field.field_info, params.Form):
            return None  # forms (uploads) are bounded by BodySizeLimitMiddleware and the upload checks
        schema = self.body_field.field_info.annotation
        if isinstance(schema, type) and issubclass(schema, StrictModel):
            return BodyBudget(schema.max_body_bytes, schema.max_json_values)
        return DEFAULT_BUDGET
