"""The embedding worker's app (`cnclip worker`): only the model, as its own process.

It serves the KServe v2 / Triton protocol (`/v2`, see api/kserve.py) around a local encoder, plus
`/healthz`, `/readyz` (the encoder is warm) and `/metrics`; no catalog, no `/v1`, no UI. An API
process with `CNCLIP_ENCODER=triton://worker-host:port` embeds through it: the split deployment of
the design card, where the worker owns the accelerator and the API nodes own the catalog.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response

from api import kserve
from api.config import Settings
from api.deps import ReadAccess
from api.errors import install_error_handlers
from api.metrics import CONTENT_TYPE_LATEST, RequestMetricsMiddleware, ServiceMetrics
from api.schemas import Health
from indexer.runtime import open_runtime
from retrieval.errors import EncoderUnavailable
from retrieval.memory import return_large_frees_to_os
from retrieval.types import Encoder

log = logging.getLogger("cnclip.worker")


def create_worker_app(settings: Settings, encoder: Encoder | None = None) -> FastAPI:
    """The worker: `encoder` is injected by tests; otherwise the lifespan opens a local encoder
    from `settings` (warming every bucket) and closes it on shutdown."""
    metrics = ServiceMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        return_large_frees_to_os()  # see retrieval/memory.py
        # The worker runs the model itself, whatever CNCLIP_ENCODER says: it is the remote end.
        local = settings.model_copy(update={"encoder": "local"})
        runtime = open_runtime(
            local, catalog=False, encoder=True if encoder is None else encoder, warm=False, observer=metrics
        )
        async with runtime as rt:
            app.state.encoder = rt.encoder
            metrics.query_cache.watch(getattr(rt.encoder, "query_cache", None))  # an injected encoder may have none
            try:
                await rt.start_encoders()
                yield
            finally:
                app.state.encoder = None

    app = FastAPI(
        title="cnclip-search worker",
        summary="The embedding worker: Chinese CLIP behind the KServe v2 / Triton HTTP protocol.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.encoder = None
    install_error_handlers(app)

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz() -> Health:
        """The process is up and answering."""
        return Health(status="ok")

    @app.get("/readyz", response_model=Health, tags=["health"])
    async def readyz(request: Request) -> Health:
        """The encoder is warm (503 otherwise)."""
        encoder = request.app.state.encoder
        if encoder is None or not encoder.ready:
            raise EncoderUnavailable("the encoder is still warming up")
        return Health(status="ready")

    @app.get("/metrics", dependencies=[ReadAccess], tags=["health"])
    async def metrics_route(request: Request) -> Response:
        """Prometheus text format: requests, batches, inference time, queue depth."""
        metrics.refresh(request.app.state.encoder, None)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    app.include_router(kserve.router)
    # /v2 caps and reads its own bodies (api/kserve_tensors.py MAX_BODY_BYTES); metrics time every request.
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
    return app
