"""Prometheus metrics on a registry of the app's own (no module globals, so two apps in one
process — as in tests — never share or clash).

- request latency per route template and status (a middleware),
- per-stage timings of searches (encode, search, db) from the routes,
- the encoder's batches: size per tower, inference time per tower and bucket (an
  `EncoderObserver` the encoder calls after every batch),
- batcher queue depth per tower and items per collection, read at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE_LATEST
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from indexer.types import Catalog
from retrieval.types import TOWERS

# Seconds; from sub-millisecond (fake encoder, cached search) to a slow CPU batch.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class ServiceMetrics:
    """All metrics of one app, on their own `CollectorRegistry`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request_seconds = Histogram(
            "cnclip_http_request_duration_seconds",
            "HTTP request latency by route template.",
            ["method", "route", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_seconds = Histogram(
            "cnclip_request_stage_seconds",
            "Time per stage (encode, search, db, ...) inside a request.",
            ["route", "stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_items = Histogram(
            "cnclip_batch_size",
            "Real (unpadded) items per encoder batch.",
            ["tower"],
            buckets=_BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.inference_seconds = Histogram(
            "cnclip_inference_seconds",
            "Model inference time per batch, by tower and bucket.",
            ["tower", "bucket"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_stage_seconds = Histogram(
            "cnclip_batch_stage_seconds",
            "Encoder time per batch and stage (preprocess, queue, infer, ...).",
            ["tower", "stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("cnclip_batcher_queue_depth", "Items waiting in the batcher.", ["tower"], registry=r)
        self.collection_items = Gauge(
            "cnclip_collection_items", "Items per collection.", ["collection", "kind"], registry=r
        )
        self.collection_vectors = Gauge(
            "cnclip_collection_vectors", "Vectors in each collection's index.", ["collection", "kind"], registry=r
        )

    # --- EncoderObserver ------------------------------------------------------------------
    def batch_done(self, tower: str, bucket: int, items: int, timings: Mapping[str, float]) -> None:
        """Called by the encoder after every batch; `timings` are seconds per stage."""
        self.batch_items.labels(tower).observe(items)
        for stage, seconds in timings.items():
            self.batch_stage_seconds.labels(tower, stage).observe(seconds)
            if stage == "inference":
                self.inference_seconds.labels(tower, str(bucket)).observe(seconds)

    # --- routes ---------------------------------------------------------------------------
    def observe_stages(self, route: str, timings_ms: Mapping[str, float]) -> None:
        for stage, ms in timings_ms.items():
            self.stage_seconds.labels(route, stage).observe(ms / 1000.0)

    # --- scrape -----------------------------------------------------------------------------
    def refresh(self, encoder: Any, catalog: Catalog | None) -> None:
        """Read the gauges that live elsewhere. Blocking (SQL): call it from a worker thread."""
        queue_depth = getattr(encoder, "queue_depth", None)
        if callable(queue_depth):
            for tower in TOWERS:
                self.queue_depth.labels(tower).set(queue_depth(tower))
        if catalog is not None:
            self.collection_items.clear()
            self.collection_vectors.clear()
            for c in catalog.list_collections():
                self.collection_items.labels(c.name, c.kind).set(c.items)
                self.collection_vectors.labels(c.name, c.kind).set(c.vectors)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetricsMiddleware:
    """Times every HTTP request, labelled by the matched route's template (`/v1/items/{item_id}`),
    never the raw path, so ids do not blow up the label set."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.request_seconds.labels(scope["method"], template, str(status)).observe(
                time.perf_counter() - start
            )
