"""Dependencies the routes declare with `Annotated`: the app's settings, encoder, collection service
(the one door to storage) and stores (all from `app.state`, set by the lifespan), API-key checks, and
`run_blocking` (api/blocking.py) for the service's synchronous calls: SQL and the vector engine never
run on the event loop."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from api.blocking import run_blocking as run_blocking  # re-exported for the routes
from api.config import Settings
from api.errors import Unauthorized
from api.label_store import LabelSetStore
from api.metrics import ServiceMetrics
from indexer.service.collections import CollectionService
from retrieval.errors import EncoderUnavailable
from retrieval.types import Encoder


async def _settings(request: Request) -> Settings:
    return request.app.state.settings


async def _encoder(request: Request) -> Encoder:
    encoder = getattr(request.app.state, "encoder", None)
    if encoder is None or not encoder.ready:
        raise EncoderUnavailable("the model is not loaded yet; retry in a moment")
    return encoder


async def _metrics(request: Request) -> ServiceMetrics:
    return request.app.state.metrics


async def _label_sets(request: Request) -> LabelSetStore:
    return request.app.state.label_sets


async def _collections(request: Request) -> CollectionService:
    service = getattr(request.app.state, "service", None)
    if service is None:
        raise EncoderUnavailable("the catalog is not open yet; retry in a moment")
    return service


def _presented_key(request: Request) -> bytes | None:
    """The key's bytes as they came on the wire. Header values are bytes; Starlette hands them over
    decoded as latin-1, so encoding them back as latin-1 gives those bytes exactly. The configured key
    is compared as UTF-8 (docs/api.md): a client sends `CNCLIP_API_KEY=clé` as the bytes `cl\\xc3\\xa9`,
    which is what curl, httpx (given bytes) and browsers' fetch with an encoded value send."""
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip().encode("latin-1")
    key = request.headers.get("x-api-key")
    return key.encode("latin-1") if key is not None else None


def _check_key(request: Request, required: bool) -> None:
    settings: Settings = request.app.state.settings
    if settings.api_key is None or not required:
        return
    presented = _presented_key(request)
    if presented is None:
        raise Unauthorized("this request needs the API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")
    expected = settings.api_key.get_secret_value().encode("utf-8")
    if not hmac.compare_digest(presented, expected):  # bytes against bytes, in constant time
        raise Unauthorized("the API key is wrong")


async def require_write_key(request: Request) -> None:
    """Every write needs the key (when one is configured)."""
    _check_key(request, required=True)


async def require_read_key(request: Request) -> None:
    """Reads need the key only when `require_key_for_reads` is set."""
    _check_key(request, required=request.app.state.settings.require_key_for_reads)


SettingsDep = Annotated[Settings, Depends(_settings)]
EncoderDep = Annotated[Encoder, Depends(_encoder)]
MetricsDep = Annotated[ServiceMetrics, Depends(_metrics)]
LabelSetsDep = Annotated[LabelSetStore, Depends(_label_sets)]
CollectionsDep = Annotated[CollectionService, Depends(_collections)]
ReadAccess = Depends(require_read_key)
WriteAccess = Depends(require_write_key)
