"""Prometheus metrics on a registry of the app's own (no module globals, so two apps in one
process — as in tests — never share or clash). Names follow Prometheus conventions: counters end
in `_total`, durations are in seconds, and no `_created` series are exposed.

- requests (count and latency) per route template and status, and errors per error code (a
  middleware; static files are one route label per mount, unknown paths `unmatched`),
- items indexed through the API per collection, embeddings computed per tower,
- hits, misses and entries of the encoder's query cache (text embeddings) and of the zero-shot
  label-embedding cache, read at scrape time,
- per-stage timings of searches (encode, search, db) from the routes,
- the encoder's batches: size per tower, inference time per tower and bucket (an
  `EncoderObserver` the encoder calls after every batch),
- batcher queue depth per tower and items per collection, read at scrape time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE_LATEST
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from indexer.service.collections import CollectionService
from retrieval.types import TOWERS

# Seconds; from sub-millisecond (fake encoder, cached search) to a slow CPU batch.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class ServiceMetrics:
    """All metrics of one app, on their own `CollectorRegistry`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # In this order in the scrape: counters and caches, histograms, gauges.
        self._add_counters(self.registry)
        self._add_histograms(self.registry)
        self._add_gauges(self.registry)

    def _add_counters(self, r: CollectorRegistry) -> None:
        self.requests = Counter(
            "cnclip_http_requests_total",
            "HTTP requests by route template and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.errors = Counter(
            "cnclip_http_errors_total",
            "Error responses by route template and error code.",
            ["route", "code"],
            registry=r,
        )
        self.items_indexed = Counter(
            "cnclip_items_indexed_total",
            "Items added through the API (duplicates not counted).",
            ["collection", "kind"],
            registry=r,
        )
        self.embeddings = Counter(
            "cnclip_embeddings_total", "Inputs embedded by the model, by tower.", ["tower"], registry=r
        )
        self.label_cache = _CacheCollector("cnclip_label_cache", "Zero-shot label embeddings")
        r.register(self.label_cache)
        self.query_cache = _CacheCollector("cnclip_query_cache", "Text embeddings", {"tower": "text"})
        r.register(self.query_cache)

    def _add_histograms(self, r: CollectorRegistry) -> None:
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

    def _add_gauges(self, r: CollectorRegistry) -> None:
        self.queue_depth = Gauge("cnclip_batcher_queue_depth", "Items waiting in the batcher.", ["tower"], registry=r)
        self.collection_items = Gauge(
            "cnclip_collection_items", "Items per collection.", ["collection", "kind"], registry=r
        )
        self.collection_vectors = Gauge(
            "cnclip_collection_vectors", "Vectors in each collection's index.", ["collection", "kind"], registry=r
        )
        self.collection_degraded = Gauge(
            "cnclip_collection_degraded",
            "1 while a collection's vector store fails (its searches answer 503), else 0.",
            ["collection", "kind"],
            registry=r,
        )

    # --- EncoderObserver ------------------------------------------------------------------
    def batch_done(self, tower: str, bucket: int, items: int, timings: Mapping[str, float]) -> None:
        """Called by the encoder after every batch; `timings` are seconds per stage."""
        self.batch_items.labels(tower).observe(items)
        self.embeddings.labels(tower).inc(items)
        for stage, seconds in timings.items():
            self.batch_stage_seconds.labels(tower, stage).observe(seconds)
            if stage == "inference":
                self.inference_seconds.labels(tower, str(bucket)).observe(seconds)

    # --- routes ---------------------------------------------------------------------------
    def observe_stages(self, route: str, timings_ms: Mapping[str, float]) -> None:
        for stage, ms in timings_ms.items():
            self.stage_seconds.labels(route, stage).observe(ms / 1000.0)

    # --- scrape -----------------------------------------------------------------------------
    def refresh(self, encoder: Any, service: CollectionService | None) -> None:
        """Read the gauges that live elsewhere. Blocking (SQL): call it from a worker thread."""
        queue_depth = getattr(encoder, "queue_depth", None)
        if callable(queue_depth):
            for tower in TOWERS:
                self.queue_depth.labels(tower).set(queue_depth(tower))
        if service is not None:
            self.collection_items.clear()
            self.collection_vectors.clear()
            self.collection_degraded.clear()
            for c, _default in service.list_all():
                self.collection_items.labels(c.name, c.kind).set(c.items)
                self.collection_vectors.labels(c.name, c.kind).set(c.vectors)
                self.collection_degraded.labels(c.name, c.kind).set(1 if c.degraded else 0)

    def render(self) -> bytes:
        return generate_latest(_WithoutCreated(self.registry))


class _CacheCollector(Collector):
    """Hits, misses and entries of a cache that lives in `retrieval` (which knows nothing of
    Prometheus), read at scrape time from the object that counts them: anything with `hits`,
    `misses` and a length, such as `retrieval.query_cache.QueryCache`. Until `watch` is given one,
    all three read 0."""

    def __init__(self, prefix: str, what: str, labels: Mapping[str, str] | None = None) -> None:
        self.prefix, self.what = prefix, what
        self.labels = dict(labels or {})
        self.cache: Any = None

    def watch(self, cache: Any) -> None:
        self.cache = cache

    def describe(self) -> Iterable[Metric]:
        return self._families(0, 0, 0)

    def collect(self) -> Iterable[Metric]:
        c = self.cache
        return self._families(c.hits, c.misses, len(c)) if c is not None else self._families(0, 0, 0)

    def _families(self, hits: int, misses: int, entries: int) -> list[Metric]:
        names, values = list(self.labels), list(self.labels.values())
        hits_family = CounterMetricFamily(f"{self.prefix}_hits", f"{self.what} served from the cache.", labels=names)
        hits_family.add_metric(values, hits)
        misses_family = CounterMetricFamily(
            f"{self.prefix}_misses", f"{self.what} computed by the model.", labels=names
        )
        misses_family.add_metric(values, misses)
        entries_family = GaugeMetricFamily(f"{self.prefix}_entries", f"{self.what} held in the cache.", labels=names)
        entries_family.add_metric(values, entries)
        return [hits_family, misses_family, entries_family]


class _WithoutCreated(Collector):
    """The registry's metrics minus their `_created` samples. prometheus_client only offers a
    process-wide switch for these (an env var read at import, or `disable_created_metrics()`),
    which would reach into every other registry in the process; filtering here is local."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        for metric in self.registry.collect():
            kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            kept.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield kept


_ERROR_BODY_LIMIT = 64 * 1024  # an error body is one small JSON object; never buffer more


def route_label(scope: Scope, before_routing: Scope) -> str:
    """The label for a request: the route's template (`/v1/items/{item_id}`), never the raw path,
    so ids do not blow up the label set; the files of a static mount are one value
    (`/static/{path}`); anything else is `unmatched` (unknown paths, and bodies the size cap
    refused before routing). A mount rewrites the paths in `scope`, so mounts are matched
    against `before_routing`, a copy of the scope taken first."""
    template = getattr(scope.get("route"), "path", None)
    if template:
        return str(template)
    for route in getattr(scope.get("app"), "routes", ()):
        if isinstance(route, Mount) and route.matches(before_routing)[0] is Match.FULL:
            return f"{route.path}/{{path}}"
    return "unmatched"


def _error_code(body: bytes) -> str | None:
    """The `code` of the API's one error shape, `{"error": {"code": ..., "message": ...}}`."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


class RequestMetricsMiddleware:
    """Counts and times every HTTP request by route template and status; for 4xx/5xx responses
    also counts the error code read from the body (so errors answered by any layer — the error
    handlers, the body-size cap — are counted alike)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        before_routing = dict(scope)
        status = 500
        is_json = False
        error_body = b""

        async def send_with_status(message: Message) -> None:
            nonlocal status, is_json, error_body
            if message["type"] == "http.response.start":
                status = message["status"]
                content_type = dict(message.get("headers", ())).get(b"content-type", b"")
                is_json = content_type.startswith(b"application/json")
            elif message["type"] == "http.response.body" and status >= 400 and is_json:
                error_body = (error_body + message.get("body", b""))[:_ERROR_BODY_LIMIT]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            # An exception escaping the app is answered 500 by Starlette's outermost middleware.
            route = route_label(scope, before_routing)
            self.metrics.request_seconds.labels(scope["method"], route, str(status)).observe(
                time.perf_counter() - start
            )
            self.metrics.requests.labels(scope["method"], route, str(status)).inc()
            if status >= 400:
                code = _error_code(error_body) if error_body else None
                self.metrics.errors.labels(
                    route, code or ("internal_error" if status >= 500 else f"http_{status}")
                ).inc()
