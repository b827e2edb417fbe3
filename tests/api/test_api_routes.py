"""Every /v1 route on the real app: FakeEncoder (deterministic vectors) + the real catalog."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from api.config import Settings
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import CAPTIONS, GALLERY, api_client, image_bytes, seed


@pytest.fixture
def encoder() -> FakeEncoder:
    return FakeEncoder(dim=32)


@pytest.fixture
def client(settings: Settings, encoder: FakeEncoder) -> Iterator[TestClient]:
    with api_client(settings, encoder=encoder) as c:
        yield c


@pytest.fixture
def ids(client: TestClient) -> dict[str, int]:
    return seed(client)


def test_text_search_ranks_by_cosine_and_reports_stage_timings(
    client: TestClient, ids: dict[str, int], encoder: FakeEncoder
) -> None:
    query = "穿红色裙子的女孩"
    r = client.post("/v1/search/text", json={"query": query, "k": 4})
    assert r.status_code == 200, r.text
    body = r.json()
    # Brute force over the gallery with the same deterministic vectors.
    q = encoder.embed_texts_sync([query])[0]
    scores = {caption: float(encoder.embed_images_sync([image_bytes(color)])[0] @ q) for caption, _, color in GALLERY}
    expected = sorted(scores, key=scores.__getitem__, reverse=True)[:4]
    assert [res["id"] for res in body["results"]] == [ids[c] for c in expected]
    for res in body["results"]:
        assert res["score"] == pytest.approx(scores[res["caption"]], abs=1e-5)
        assert res["image_url"] == f"/v1/items/{res['id']}/image"
        assert res["thumbnail_url"] == f"/v1/items/{res['id']}/thumbnail"
        assert (res["width"], res["height"]) == (64, 48)
    assert body["collection"] == "photos"
    assert set(body["timings"]) >= {"encode", "search", "db", "total"}
    assert body["timings"]["total"] >= body["timings"]["encode"] >= 0


def test_text_search_filters_by_tags(client: TestClient, ids: dict[str, int]) -> None:
    r = client.post("/v1/search/text", json={"query": "动物", "k": 10, "filters": {"tags": ["动物"]}})
    assert r.status_code == 200, r.text
    assert {res["caption"] for res in r.json()["results"]} == {"草地上的小狗", "一只黑猫"}


def test_image_search_finds_the_same_image_first(client: TestClient, ids: dict[str, int]) -> None:
    caption, _, color = GALLERY[2]
    r = client.post("/v1/search/image", files={"file": ("q.png", image_bytes(color), "image/png")}, data={"k": "3"})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 3
    assert results[0]["id"] == ids[caption]
    assert results[0]["score"] == pytest.approx(1.0, abs=1e-5)
    assert results[1]["score"] < 0.99
    assert {"read", "encode", "search", "db"} <= set(r.json()["timings"])


def test_image_to_text_uses_the_default_text_collection(
    client: TestClient, ids: dict[str, int], encoder: FakeEncoder
) -> None:
    data = image_bytes(GALLERY[0][2])
    r = client.post(
        "/v1/search/image", files={"file": ("q.png", data, "image/png")}, data={"target": "texts", "k": "5"}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["collection"] == "captions"
    v = encoder.embed_images_sync([data])[0]
    expected = sorted(CAPTIONS, key=lambda t: -float(encoder.embed_texts_sync([t])[0] @ v))
    assert [res["caption"] for res in body["results"]] == expected
    assert all(res["image_url"] is None and res["thumbnail_url"] is None for res in body["results"])


def test_classify_returns_sorted_softmax_probabilities(client: TestClient, encoder: FakeEncoder) -> None:
    data = image_bytes((10, 200, 30))
    labels = ["猫", "狗", "汽车", "海滩"]
    r = client.post(
        "/v1/classify",
        files={"file": ("x.png", data, "image/png")},
        data={"labels": json.dumps(labels), "templates": json.dumps(["{}"])},
    )
    assert r.status_code == 200, r.text
    got = r.json()
    img = encoder.embed_images_sync([data])[0]
    logits = 100.0 * encoder.embed_texts_sync(labels) @ img
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    expected = sorted(zip(labels, probs, strict=True), key=lambda p: -p[1])
    assert [g["label"] for g in got] == [label for label, _ in expected]
    assert [g["probability"] for g in got] == pytest.approx([float(p) for _, p in expected], abs=1e-5)
    assert sum(g["probability"] for g in got) == pytest.approx(1.0, abs=1e-4)


def test_label_sets_round_trip_and_drive_classify(client: TestClient, settings: Settings) -> None:
    body = {"labels": ["猫", "狗", "鸟"], "templates": ["一张{}的照片"]}
    assert client.put("/v1/label-sets/动物", json=body).status_code == 201
    assert client.put("/v1/label-sets/动物", json=body).status_code == 200  # replaced, not created
    assert client.get("/v1/label-sets/动物").json() == {"name": "动物", **body}
    assert [s["name"] for s in client.get("/v1/label-sets").json()] == ["动物"]
    saved = json.loads((settings.data_dir / "label_sets.json").read_text(encoding="utf-8"))
    assert saved["动物"]["labels"] == ["猫", "狗", "鸟"]

    r = client.post(
        "/v1/classify", files={"file": ("x.png", image_bytes((1, 2, 3)), "image/png")}, data={"label_set": "动物"}
    )
    assert r.status_code == 200, r.text
    assert sorted(g["label"] for g in r.json()) == ["狗", "猫", "鸟"]

    assert client.delete("/v1/label-sets/动物").status_code == 204
    assert client.get("/v1/label-sets/动物").status_code == 404


def test_embed_text_and_images(client: TestClient, encoder: FakeEncoder) -> None:
    r = client.post("/v1/embed/text", json={"texts": ["猫", "狗"]})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "fake" and r.json()["dim"] == 32
    np.testing.assert_allclose(r.json()["vectors"], encoder.embed_texts_sync(["猫", "狗"]), atol=1e-6)

    a, b = image_bytes((1, 1, 1)), image_bytes((9, 9, 9), fmt="JPEG")
    r = client.post(
        "/v1/embed/image", files=[("file", ("a.png", a, "image/png")), ("file", ("b.jpg", b, "image/jpeg"))]
    )
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["vectors"], encoder.embed_images_sync([a, b]), atol=1e-6)


def test_collections_list_counts_and_defaults(client: TestClient, ids: dict[str, int]) -> None:
    listed = {c["name"]: c for c in client.get("/v1/collections").json()}
    assert listed["photos"]["kind"] == "images" and listed["photos"]["items"] == len(GALLERY)
    assert listed["captions"]["kind"] == "texts" and listed["captions"]["items"] == len(CAPTIONS)
    assert listed["photos"]["default"] and listed["captions"]["default"]
    assert client.get("/v1/collections/photos").json()["items"] == len(GALLERY)
    # Adding the same bytes again is not a new item.
    again = client.post(
        "/v1/collections/photos/items", files={"file": ("x.png", image_bytes(GALLERY[0][2]), "image/png")}
    )
    assert again.status_code == 201 and again.json() == {"id": ids[GALLERY[0][0]], "created": False}


def test_item_media_and_thumbnail_are_cached_once(client: TestClient, ids: dict[str, int], settings: Settings) -> None:
    item_id = ids["草地上的小狗"]
    item = client.get(f"/v1/items/{item_id}").json()
    assert item["caption"] == "草地上的小狗" and item["tags"] == ["动物", "狗"] and item["mime"] == "image/png"

    original = client.get(f"/v1/items/{item_id}/image")
    assert original.status_code == 200 and original.headers["content-type"] == "image/png"
    assert original.content == image_bytes(GALLERY[1][2])

    thumb = client.get(f"/v1/items/{item_id}/thumbnail")
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    cached = list((settings.data_dir / "thumbs").rglob("*.jpg"))
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns
    assert client.get(f"/v1/items/{item_id}/thumbnail").content == thumb.content
    assert cached[0].stat().st_mtime_ns == mtime  # served from the cache, not made again

    text_id = ids["一只猫"]
    assert client.get(f"/v1/items/{text_id}").json()["image_url"] is None
    assert client.get(f"/v1/items/{text_id}/image").status_code == 404


def test_similar_leaves_out_the_item_itself(client: TestClient, ids: dict[str, int]) -> None:
    item_id = ids["一只黑猫"]
    r = client.get(f"/v1/items/{item_id}/similar", params={"k": 3})
    assert r.status_code == 200, r.text
    got = [res["id"] for res in r.json()["results"]]
    assert len(got) == 3 and item_id not in got


def test_delete_item_removes_it_from_search_and_media(
    client: TestClient, ids: dict[str, int], settings: Settings
) -> None:
    item_id = ids["蓝天下的海滩"]
    client.get(f"/v1/items/{item_id}/thumbnail")
    r = client.delete(f"/v1/items/{item_id}")
    assert r.status_code == 200 and r.json() == {"deleted": 1}
    assert client.get(f"/v1/items/{item_id}").status_code == 404
    assert client.get(f"/v1/items/{item_id}/thumbnail").status_code == 404
    assert not list((settings.data_dir / "thumbs").rglob("*.jpg"))
    results = client.post("/v1/search/text", json={"query": "海滩", "k": 200}).json()["results"]
    assert item_id not in {res["id"] for res in results} and len(results) == len(GALLERY) - 1


def test_health_ready_and_metrics(client: TestClient, ids: dict[str, int], encoder: FakeEncoder) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
    client.post("/v1/search/text", json={"query": "猫"})
    client.get("/v1/items/999999")
    client.app.state.metrics.batch_done("image", 8, 5, {"queue": 0.001, "inference": 0.02})
    text = client.get("/metrics").text
    assert 'cnclip_http_request_duration_seconds_count{method="POST",route="/v1/search/text",status="200"} 1.0' in text
    assert 'route="/v1/items/{item_id}",status="404"' in text  # the template, not the raw path
    assert f'cnclip_collection_items{{collection="photos",kind="images"}} {float(len(GALLERY))}' in text
    assert 'cnclip_inference_seconds_count{bucket="8",tower="image"} 1.0' in text
    assert 'cnclip_batch_size_sum{tower="image"} 5.0' in text
    assert 'cnclip_request_stage_seconds_count{route="search_text",stage="encode"} 1.0' in text


def test_web_ui_is_served(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "以图搜图" in page.text and "/static/app.js" in page.text
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/static/style.css").status_code == 200


def test_openapi_lists_every_route(client: TestClient) -> None:
    paths = set(client.get("/openapi.json").json()["paths"])
    assert {
        "/v1/search/text",
        "/v1/search/image",
        "/v1/classify",
        "/v1/embed/text",
        "/v1/embed/image",
        "/v1/collections",
        "/v1/collections/{name}/items",
        "/v1/collections/{name}/texts",
        "/v1/items/{item_id}",
        "/v1/items/{item_id}/image",
        "/v1/items/{item_id}/thumbnail",
        "/v1/label-sets/{name}",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= paths


def test_label_sets_file_is_written_atomically(tmp_path: Path) -> None:
    from api.label_store import LabelSetStore

    store = LabelSetStore(tmp_path / "sets" / "label_sets.json")
    assert store.put("a", ["x"], None) is True
    assert store.put("a", ["x", "y"], ["{}"]) is False
    assert store.get("a") == {"labels": ["x", "y"], "templates": ["{}"]}
    assert [p.name for p in (tmp_path / "sets").iterdir()] == ["label_sets.json"]  # no temp files left


class LoopGuardCatalog:
    """Wraps the real catalog and records every method called on the event loop's thread
    (where `asyncio.get_running_loop()` succeeds): SQL and FAISS must run in worker threads."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.on_loop: list[str] = []
        self.calls: list[str] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def guarded(*args, **kwargs):  # type: ignore[no-untyped-def]
            import asyncio

            self.calls.append(name)
            try:
                asyncio.get_running_loop()
                self.on_loop.append(name)
            except RuntimeError:
                pass  # a worker thread: as it should be
            return attr(*args, **kwargs)

        return guarded


def test_catalog_is_never_called_on_the_event_loop(settings: Settings) -> None:
    from tests.support.api_helpers import open_test_catalog

    real = open_test_catalog(settings)
    guard = LoopGuardCatalog(real)
    try:
        with api_client(settings, catalog=guard) as c:  # type: ignore[arg-type]
            ids = seed(c)
            item = ids["一只黑猫"]
            c.post("/v1/search/text", json={"query": "猫", "filters": {"tags": ["动物"]}})
            c.post("/v1/search/image", files={"file": ("q.png", image_bytes((1, 2, 3)), "image/png")})
            assert c.get("/readyz").status_code == 200  # the database probe runs in a worker thread too
            c.post(
                "/v1/search/image",
                files={"file": ("q.png", image_bytes((1, 2, 3)), "image/png")},
                data={"target": "texts"},
            )
            for path in ("", "/image", "/thumbnail", "/similar"):
                assert c.get(f"/v1/items/{item}{path}").status_code == 200
            c.get("/v1/collections")
            c.get("/v1/collections/photos")
            c.get("/metrics")
            c.delete(f"/v1/items/{item}")
    finally:
        real.close()
    assert {"search", "get_many", "add_images", "add_texts", "get", "vector", "delete", "ping"} <= set(guard.calls)
    assert guard.on_loop == []


def test_search_refuses_a_collection_another_model_embedded(settings: Settings, ids: dict[str, int]) -> None:
    # Same dimension, other weights: searching old vectors with new queries would rank at random.
    with api_client(settings, encoder=FakeEncoder(dim=32, model_id="retrained@0123456789ab")) as other:
        r = other.post("/v1/search/text", json={"query": "红色", "collection": "photos"})
        assert r.status_code == 422
        assert "indexed with fake" in r.json()["error"]["message"] and "Re-index" in r.json()["error"]["message"]
    # A bare name recorded before ids carried a fingerprint is taken as the same model.
    with api_client(settings, encoder=FakeEncoder(dim=32, model_id="fake@0123456789ab")) as upgraded:
        r = upgraded.post("/v1/search/text", json={"query": "红色", "collection": "photos"})
        assert r.status_code == 200 and r.json()["results"]
