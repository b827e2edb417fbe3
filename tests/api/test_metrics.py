"""/metrics follows Prometheus conventions: parsed with prometheus_client's own parser, every counter
ends in `_total`, there are no `_created` series, and route labels are templates (static files one
value, unknown paths `unmatched`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from api.config import Settings
from tests.support.api_helpers import CAPTIONS, GALLERY, api_client, image_bytes, seed

COUNTERS = {
    "cnclip_http_requests",
    "cnclip_http_errors",
    "cnclip_items_indexed",
    "cnclip_embeddings",
    "cnclip_label_cache_hits",
    "cnclip_label_cache_misses",
    "cnclip_query_cache_hits",
    "cnclip_query_cache_misses",
}
HISTOGRAMS = {
    "cnclip_http_request_duration_seconds",
    "cnclip_request_stage_seconds",
    "cnclip_batch_size",
    "cnclip_inference_seconds",
    "cnclip_batch_stage_seconds",
}
GAUGES = {
    "cnclip_batcher_queue_depth",
    "cnclip_collection_items",
    "cnclip_collection_vectors",
    "cnclip_label_cache_entries",
    "cnclip_query_cache_entries",
}


def scrape(client: TestClient) -> tuple[dict[str, str], list[Sample]]:
    """({family name: type}, every sample) of one scrape."""
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = list(text_string_to_metric_families(r.text))
    return {f.name: f.type for f in families}, [s for f in families for s in f.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float:
    """The one sample called `name` whose labels include `labels` (0 when there is none)."""
    found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else 0.0


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with api_client(settings) as c:
        yield c


def test_names_types_and_no_created_series(client: TestClient) -> None:
    seed(client)
    client.post("/v1/search/text", json={"query": "猫"})
    client.app.state.metrics.batch_done("text", 4, 3, {"inference": 0.01})
    types, samples = scrape(client)
    assert {n: types.get(n) for n in COUNTERS} == dict.fromkeys(COUNTERS, "counter")
    assert {n: types.get(n) for n in HISTOGRAMS} == dict.fromkeys(HISTOGRAMS, "histogram")
    assert {n: types.get(n) for n in GAUGES} == dict.fromkeys(GAUGES, "gauge")
    assert not [n for n in types if n.endswith("_created")]
    assert not [s.name for s in samples if s.name.endswith("_created")]
    counter_samples = {s.name for s in samples if types.get(s.name.removesuffix("_total")) == "counter"}
    assert counter_samples and all(name.endswith("_total") for name in counter_samples)
    # Every sample belongs to a family of ours: nothing leaked in from the process-wide registry.
    assert all(s.name.startswith("cnclip_") for s in samples)


def test_requests_and_errors_are_counted_by_route_template_and_code(client: TestClient) -> None:
    ids = seed(client)
    item = ids[GALLERY[0][0]]
    client.post("/v1/search/text", json={"query": "猫"})
    client.post("/v1/search/text", json={"query": "狗"})
    assert client.get(f"/v1/items/{item}").status_code == 200
    assert client.get("/v1/items/999999").status_code == 404
    assert client.post("/v1/search/text", json={"query": "猫", "k": 100000}).status_code == 422
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/static/style.css").status_code == 200
    assert client.get("/no/such/page").status_code == 404
    client.get("/metrics")
    _, samples = scrape(client)

    requests = "cnclip_http_requests_total"
    assert value(samples, requests, method="POST", route="/v1/search/text", status="200") == 2
    assert value(samples, requests, method="POST", route="/v1/search/text", status="422") == 1
    assert value(samples, requests, route="/v1/items/{item_id}", status="200") == 1
    assert value(samples, requests, route="/v1/items/{item_id}", status="404") == 1
    assert value(samples, requests, route="/static/{path}", status="200") == 2  # both files, one label
    assert value(samples, requests, route="/metrics", status="200") == 1  # this scrape is not counted yet
    assert value(samples, requests, route="unmatched", status="404") == 1
    routes = {s.labels["route"] for s in samples if s.name == requests}
    assert not [r for r in routes if "999999" in r or "app.js" in r or "/no/" in r]  # never a raw path

    errors = "cnclip_http_errors_total"
    assert value(samples, errors, route="/v1/items/{item_id}", code="not_found") == 1
    assert value(samples, errors, route="/v1/search/text", code="invalid_input") == 1
    assert value(samples, errors, route="unmatched", code="not_found") == 1
    assert sum(s.value for s in samples if s.name == errors) == 3


def test_a_refused_oversized_body_counts_as_payload_too_large(settings: Settings) -> None:
    small = settings.model_copy(update={"max_image_bytes": 1000})
    with api_client(small) as c:
        big = b"x" * (3 << 20)  # more than the cap plus the form overhead
        r = c.post("/v1/search/image", files={"file": ("q.png", big, "image/png")})
        assert r.status_code == 413
        _, samples = scrape(c)
    # Refused before routing, so no route template: counted under its code all the same.
    assert value(samples, "cnclip_http_errors_total", code="payload_too_large") == 1


def test_items_indexed_counts_new_items_only(client: TestClient) -> None:
    seed(client)
    again = client.post(
        "/v1/collections/photos/items", files={"file": ("p.png", image_bytes(GALLERY[0][2]), "image/png")}
    )
    assert again.status_code == 201 and again.json()["created"] is False  # a duplicate adds nothing
    _, samples = scrape(client)
    assert value(samples, "cnclip_items_indexed_total", collection="photos", kind="images") == len(GALLERY)
    assert value(samples, "cnclip_items_indexed_total", collection="captions", kind="texts") == len(CAPTIONS)


def test_label_cache_hits_and_misses(client: TestClient) -> None:
    labels = ["猫", "狗", "汽车"]
    form = {"labels": json.dumps(labels)}
    for _ in range(2):
        r = client.post("/v1/classify", files={"file": ("c.png", image_bytes((1, 2, 3)), "image/png")}, data=form)
        assert r.status_code == 200, r.text
    _, samples = scrape(client)
    assert value(samples, "cnclip_label_cache_misses_total") == len(labels)  # the first call computes them
    assert value(samples, "cnclip_label_cache_hits_total") == len(labels)  # the second reads them
    assert value(samples, "cnclip_label_cache_entries") == len(labels)


def test_embeddings_are_counted_per_tower(client: TestClient) -> None:
    metrics = client.app.state.metrics
    metrics.batch_done("text", 4, 3, {"inference": 0.01})
    metrics.batch_done("text", 1, 1, {"inference": 0.01})
    metrics.batch_done("image", 8, 5, {"inference": 0.02})
    _, samples = scrape(client)
    assert value(samples, "cnclip_embeddings_total", tower="text") == 4  # real rows, not bucket sizes
    assert value(samples, "cnclip_embeddings_total", tower="image") == 5
