"""The app factory. The lifespan owns the resources through the composition root
(indexer/runtime.py): it opens the catalog and the encoder (warming every bucket) unless they were
injected, puts the collection service, the encoder and the classifier on `app.state`, and closes
what it opened."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from api import kserve
from api.config import Settings
from api.docs import install_docs
from api.errors import install_error_handlers
from api.label_store import LabelSetStore
from api.limits import BodySizeLimitMiddleware, max_request_bytes
from api.metrics import RequestMetricsMiddleware, ServiceMetrics
from api.openapi import install_openapi
from api.readiness import Readiness, database_probe, encoder_probe
from api.request_guard import RequestGuardMiddleware
from api.routes import classify, collections, duplicates, embed, health, items, label_sets, search
from api.watch_metrics import WatchCollector
from api.whole_files import WholeFileResponse, WholeFiles
from indexer.runtime import open_runtime
from indexer.service.ports import Catalog
from indexer.watch.health import WatchHealth
from indexer.watch.serve import watch_served_folders
from indexer.watch.settings import watched_folders
from retrieval.memory import return_large_frees_to_os
from retrieval.types import Encoder, HealthChecked

log = logging.getLogger("cnclip.api")

WEB_DIR = Path(__file__).resolve().parent.parent / "web"


def _lifespan(
    settings: Settings, metrics: ServiceMetrics, encoder: Encoder | None, catalog: Catalog | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the composition root opened for a server, its parts on `app.state`."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        return_large_frees_to_os()  # decoded images and large bodies leave no memory behind (retrieval/memory.py)
        # A server opens and reconciles every collection's vector store at start, and sweeps what a
        # killed process left under the media folder.
        runtime = open_runtime(
            settings,
            catalog=True if catalog is None else catalog,
            encoder=True if encoder is None else encoder,
            stores="now",
            sweep_media=True,
            warm=False,
            observer=metrics,
        )
        async with runtime as rt:
            assert rt.service is not None and rt.zeroshot is not None
            app.state.runtime = rt
            app.state.service = rt.service
            app.state.readiness = readiness = Readiness()
            readiness.add(database_probe(rt.service.ping, settings.readiness_interval_s))
            for model_id, each in rt.encoders.items():  # a remote encoder can go away after its start
                if isinstance(each, HealthChecked):
                    readiness.add(encoder_probe(model_id, each.check_health, settings.readiness_interval_s))
            readiness.add(app.state.watch_health)  # CNCLIP_WATCH's watchers (started below)
            app.state.encoder = rt.encoder
            app.state.zeroshot = rt.zeroshot
            metrics.label_cache.watch(rt.zeroshot.cache)
            metrics.query_cache.watch(getattr(rt.encoder, "query_cache", None))  # an injected encoder may have none
            try:
                await rt.start_encoders()
                # CNCLIP_WATCH: one background task per folder, stopped before the runtime closes.
                watch_served_folders(rt, settings, watched_folders(settings.watch), app.state.watch_health)
                yield
            finally:
                app.state.runtime = app.state.service = app.state.encoder = None

    return lifespan


def create_app(settings: Settings, encoder: Encoder | None = None, catalog: Catalog | None = None) -> FastAPI:
    """Build the service. `encoder` / `catalog` are injected by tests; otherwise the lifespan
    opens them from `settings` (and closes them on shutdown)."""
    metrics = ServiceMetrics()
    lifespan = _lifespan(settings, metrics, encoder, catalog)

    app = FastAPI(
        title="cnclip-search",
        summary="Cross-modal search with Chinese CLIP: text→image, image→text, image→image, zero-shot.",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's pages load their JavaScript from a CDN; api/docs.py serves local ones
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.watch_health = WatchHealth()
    metrics.registry.register(WatchCollector(app.state.watch_health))
    app.state.runtime = None
    app.state.encoder = None
    app.state.service = None
    app.state.database_probe = None
    app.state.label_sets = LabelSetStore(settings.data_dir / "label_sets.json")

    install_error_handlers(app)
    for module in (search, classify, embed, collections, duplicates, items, label_sets, health):
        app.include_router(module.router)
    app.include_router(kserve.router)  # KServe v2 / Triton HTTP protocol (/v2), see api/kserve.py

    _serve_the_ui(app)
    install_docs(app)

    # The last added runs outermost: metrics time every request, including bodies the cap refuses.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_request_bytes(settings))
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
    # Outermost: request id, body deadline, security headers, and the catch-all 500 for everything inside.
    app.add_middleware(RequestGuardMiddleware, body_timeout_s=settings.body_read_timeout_s)
    install_openapi(app)
    return app


def _serve_the_ui(app: FastAPI) -> None:
    """The web UI: its page at `/`, the favicon browsers ask for, the static files under `/static`."""

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return WholeFileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        # Pages link /static/favicon.svg; this answers the browsers' default request (no 404s).
        return WholeFileResponse(
            WEB_DIR / "favicon.svg", media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"}
        )

    app.mount("/static", WholeFiles(StaticFiles(directory=WEB_DIR)), name="static")  # api/whole_files.py
