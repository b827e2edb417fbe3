"""The real app with nothing injected: the lifespan opens the local ONNX encoder on the toy model
(warming its buckets) and the real catalog, and closes both on shutdown."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient

from api import create_app
from api.config import Settings
from tests.support.api_helpers import GALLERY, image_bytes


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, toy_model_dir) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    settings = Settings(
        _env_file=None,
        model_dir=toy_model_dir,
        data_dir=tmp_path_factory.mktemp("toy-api"),
        provider="cpu",
        buckets=[1, 4],
        threads_per_stream=1,
    )
    app = create_app(settings)
    with TestClient(app) as c:
        assert c.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        for caption, tags, color in GALLERY:
            r = c.post(
                "/v1/collections/photos/items",
                files={"file": ("p.jpg", image_bytes(color, (96, 80), "JPEG"), "image/jpeg")},
                data={"caption": caption, "tags": json.dumps(tags)},
            )
            assert r.status_code == 201, r.text
        yield c
    # The lifespan closed what it opened.
    assert app.state.encoder is None and app.state.service is None and app.state.runtime is None


def embed_text(client: TestClient, texts: list[str]) -> np.ndarray:
    return np.asarray(client.post("/v1/embed/text", json={"texts": texts}).json()["vectors"], dtype=np.float32)


def embed_image(client: TestClient, data: bytes) -> np.ndarray:
    r = client.post("/v1/embed/image", files={"file": ("q.jpg", data, "image/jpeg")})
    return np.asarray(r.json()["vectors"][0], dtype=np.float32)


def test_ready_with_the_toy_model(client: TestClient) -> None:
    assert client.get("/readyz").json() == {"status": "ready"}
    [photos] = client.get("/v1/collections").json()
    assert photos["model"] == client.app.state.encoder.model_id and photos["dim"] == 32
    assert photos["items"] == photos["vectors"] == len(GALLERY)


def test_image_search_with_the_real_encoder_finds_the_same_photo(client: TestClient) -> None:
    caption, _, color = GALLERY[4]
    r = client.post("/v1/search/image", files={"file": ("q.jpg", image_bytes(color, (96, 80), "JPEG"), "image/jpeg")})
    assert r.status_code == 200, r.text
    top = r.json()["results"][0]
    assert top["caption"] == caption and top["score"] == pytest.approx(1.0, abs=1e-4)


def test_text_search_matches_the_encoders_own_vectors(client: TestClient) -> None:
    query = "蓝天下的海滩"
    body = client.post("/v1/search/text", json={"query": query, "k": len(GALLERY)}).json()
    q = embed_text(client, [query])[0]
    assert np.linalg.norm(q) == pytest.approx(1.0, abs=1e-4)
    expected = {c: float(embed_image(client, image_bytes(col, (96, 80), "JPEG")) @ q) for c, _, col in GALLERY}
    got = {res["caption"]: res["score"] for res in body["results"]}
    assert got == pytest.approx(expected, abs=1e-4)
    assert [res["caption"] for res in body["results"]] == sorted(expected, key=lambda c: -expected[c])
    assert body["timings"]["encode"] > 0


def test_classify_with_the_real_encoder(client: TestClient) -> None:
    data = image_bytes((30, 140, 220), (96, 80), "JPEG")
    labels = ["猫", "狗", "大海", "汽车"]
    r = client.post(
        "/v1/classify",
        files={"file": ("c.jpg", data, "image/jpeg")},
        data={"labels": ",".join(labels), "templates": '["{}"]'},
    )
    assert r.status_code == 200, r.text
    got = {g["label"]: g["probability"] for g in r.json()}
    logits = client.app.state.encoder.logit_scale * (embed_text(client, labels) @ embed_image(client, data))
    p = np.exp(logits - logits.max())
    p /= p.sum()
    assert got == pytest.approx(dict(zip(labels, p.tolist(), strict=True)), abs=1e-4)


def _text_metric(client: TestClient, name: str) -> float:
    prefix = f'{name}{{tower="text"}} '
    return sum(
        float(line.removeprefix(prefix)) for line in client.get("/metrics").text.splitlines() if line.startswith(prefix)
    )


def test_metrics_show_real_batches(client: TestClient) -> None:
    texts_before = _text_metric(client, "cnclip_embeddings_total")
    # A text no other test embeds: a cached one would not reach the model.
    client.post("/v1/search/text", json={"query": "窗台上睡觉的橘猫"})
    assert _text_metric(client, "cnclip_embeddings_total") == texts_before + 1  # the encoder reports every batch
    text = client.get("/metrics").text
    assert 'cnclip_inference_seconds_count{bucket="1",tower="text"}' in text
    assert 'cnclip_inference_seconds_count{bucket="1",tower="image"}' in text
    assert 'cnclip_batcher_queue_depth{tower="text"} 0.0' in text
    assert 'cnclip_batch_stage_seconds_count{stage="preprocess",tower="image"}' in text


def test_a_repeated_text_search_is_a_query_cache_hit(client: TestClient) -> None:
    names = ("cnclip_query_cache_hits_total", "cnclip_query_cache_misses_total", "cnclip_embeddings_total")
    hits, misses, embedded = (_text_metric(client, name) for name in names)
    bodies = [client.post("/v1/search/text", json={"query": "雪山下的湖泊"}).json() for _ in range(2)]
    assert bodies[0]["results"] == bodies[1]["results"]
    assert _text_metric(client, "cnclip_query_cache_misses_total") == misses + 1
    assert _text_metric(client, "cnclip_query_cache_hits_total") == hits + 1
    assert _text_metric(client, "cnclip_embeddings_total") == embedded + 1  # the model ran once
    assert _text_metric(client, "cnclip_query_cache_entries") >= 1
