"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from api.deps import MetricsDep, ReadAccess, run_blocking
from api.guarded_route import GuardedRoute
from api.metrics import CONTENT_TYPE_LATEST
from api.schemas import Health
from retrieval.errors import EncoderUnavailable

router = APIRouter(tags=["health"], route_class=GuardedRoute)


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up and answering."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health)
async def readyz(request: Request) -> Health:
    """Encoders warm, catalog open, its database and a remote encoder answering (503 with Retry-After
    otherwise; each is asked at most every `CNCLIP_READINESS_INTERVAL_S`, api/readiness.py)."""
    state = request.app.state
    if state.service is None:
        raise EncoderUnavailable("the catalog is not open yet")
    if state.encoder is None or not state.encoder.ready:
        raise EncoderUnavailable("the encoder is still warming up")
    problem = await state.readiness.problem()
    if problem is not None:
        raise problem
    return Health(status="ready")


@router.get("/metrics", dependencies=[ReadAccess])
async def metrics(request: Request, service_metrics: MetricsDep) -> Response:
    """Prometheus text format."""
    await run_blocking(service_metrics.refresh, request.app.state.encoder, request.app.state.service)
    return Response(service_metrics.render(), media_type=CONTENT_TYPE_LATEST)
