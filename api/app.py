"""The app factory. The lifespan owns the resources: it opens the encoder (warming every bucket)
and the catalog unless they were injected, puts them on `app.state`, and closes what it opened."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from api import kserve
from api.blocking import run_blocking
from api.config import Settings
from api.docs import install_docs
from api.errors import install_error_handlers
from api.label_store import LabelSetStore
from api.limits import BodySizeLimitMiddleware, max_request_bytes
from api.metrics import RequestMetricsMiddleware, ServiceMetrics
from api.openapi import install_openapi
from api.readiness import DatabaseProbe
from api.request_guard import RequestGuardMiddleware
from api.routes import classify, collections, duplicates, embed, health, items, label_sets, search
from indexer.engines import open_catalog
from indexer.media import media_root
from indexer.service import collection_service
from indexer.types import Catalog
from retrieval.encoder import create_encoder
from retrieval.memory import return_large_frees_to_os
from retrieval.types import Encoder
from retrieval.zeroshot import ZeroShotClassifier

log = logging.getLogger("cnclip.api")

WEB_DIR = Path(__file__).resolve().parent.parent / "web"


def create_app(settings: Settings, encoder: Encoder | None = None, catalog: Catalog | None = None) -> FastAPI:
    """Build the service. `encoder` / `catalog` are injected by tests; otherwise the lifespan
    opens them from `settings` (and closes them on shutdown)."""
    metrics = ServiceMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        return_large_frees_to_os()  # decoded images and large bodies leave no memory behind (retrieval/memory.py)
        own_catalog = catalog is None
        own_encoder = encoder is None
        cat = await run_blocking(open_catalog, settings, sweep_media=True) if own_catalog else catalog
        try:
            enc = create_encoder(settings, observer=metrics) if own_encoder else encoder
            assert enc is not None and cat is not None
            app.state.catalog = cat
            app.state.database_probe = DatabaseProbe(cat.ping, settings.readiness_interval_s)
            app.state.encoder = enc
            app.state.service = collection_service(cat, enc, settings)  # type: ignore[arg-type]
            # One setting sizes both text-embedding caches, so 0 turns caching of text vectors off.
            app.state.zeroshot = ZeroShotClassifier(enc, cache_size=settings.query_cache_size)
            metrics.label_cache.watch(app.state.zeroshot.cache)
            metrics.query_cache.watch(getattr(enc, "query_cache", None))  # an injected encoder may have none
            try:
                if not enc.ready:
                    log.info("warming up the encoder (%s)", getattr(enc, "model_id", "?"))
                    await enc.start()
                yield
            finally:
                if own_encoder:
                    await enc.close()
        finally:
            app.state.encoder = None
            app.state.catalog = None
            app.state.service = None
            if own_catalog and cat is not None:
                await run_blocking(cat.close)

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
    app.state.encoder = None
    app.state.catalog = None
    app.state.service = None
    app.state.database_probe = None
    app.state.label_sets = LabelSetStore(settings.data_dir / "label_sets.json")
    app.state.thumbs_dir = settings.data_dir / "thumbs"
    app.state.media_dir = media_root(settings.data_dir)

    install_error_handlers(app)
    for module in (search, classify, embed, collections, duplicates, items, label_sets, health):
        app.include_router(module.router)
    app.include_router(kserve.router)  # KServe v2 / Triton HTTP protocol (/v2), see api/kserve.py

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        # Pages link /static/favicon.svg; this answers the browsers' default request (no 404s).
        return FileResponse(
            WEB_DIR / "favicon.svg", media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"}
        )

    app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
    install_docs(app)

    # The last added runs outermost: metrics time every request, including bodies the cap refuses.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_request_bytes(settings))
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
    # Outermost: request id, body deadline, security headers, and the catch-all 500 for everything inside.
    app.add_middleware(RequestGuardMiddleware, body_timeout_s=settings.body_read_timeout_s)
    install_openapi(app)
    return app
