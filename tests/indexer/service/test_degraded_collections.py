"""Issue 29 item 7: an index that cannot be trained yet is searched exactly, and one collection whose
vector store fails never stops the server — it answers 503 (naming it) and the others are served."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from api import create_app
from api.config import Settings
from indexer.domain.index_spec import parse_index
from indexer.storage.vectors.base import SearchTuning
from indexer.storage.vectors.faiss.index import VectorIndex, training_threshold
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import open_test_catalog

DIM = 128  # PQ128 divides it


def _settings(tmp_path: Path, **over: object) -> Settings:
    return Settings(_env_file=None, data_dir=tmp_path / "data", index_train_min=50, **over)


def _add(client: TestClient, name: str, texts: list[str]) -> list[int]:
    ids = []
    for start in range(0, len(texts), 50):
        r = client.post(f"/v1/collections/{name}/texts", json={"texts": texts[start : start + 50]})
        assert r.status_code == 201, r.text
        ids += [item["id"] for item in r.json()["items"]]
    return ids


def _search(client: TestClient, item_id: int, k: int = 10) -> tuple[int, dict]:
    """The items of its collection most similar to `item_id` (a search of the collection's store)."""
    r = client.get(f"/v1/items/{item_id}/similar", params={"k": k})
    return r.status_code, r.json()


def _exact(settings: Settings, item_ids: list[int], query_id: int, k: int) -> list[int]:
    """The true nearest items to `query_id`, by brute force over the stored vectors."""
    catalog = open_test_catalog(settings)
    try:
        vectors = np.stack([catalog.vector(i) for i in item_ids])
        query = catalog.vector(query_id)
    finally:
        catalog.close()
    order = [item_ids[i] for i in np.argsort(-(vectors @ query), kind="stable")]
    return [i for i in order if i != query_id][:k]


@pytest.mark.parametrize(
    ("description", "needed"),
    [("IVF1,PQ128x8", 256), ("IVF1,PQ128x4", 50), ("IVF1,PQ128", 256), ("IVF10,Flat", 390), ("IVF8,PQ64x8", 312)],
)
def test_the_training_threshold_counts_every_trained_part(description: str, needed: int) -> None:
    # 2^bits points per PQ codebook, 39 per IVF list, never below CNCLIP_INDEX_TRAIN_MIN (50 here).
    assert training_threshold(parse_index(description, DIM), SearchTuning(train_min=50)) == needed


def test_an_index_faiss_cannot_train_stays_exact_and_is_tried_again_at_twice_the_count() -> None:
    vectors = np.random.default_rng(0).standard_normal((600, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = VectorIndex(DIM, "IVF1,PQ128x8", tuning=SearchTuning(train_min=1))
    index.spec = parse_index("IVF300,Flat", DIM)  # 300 lists: FAISS refuses 100 points, whatever our threshold
    index.tuning = SearchTuning(train_min=1)
    import indexer.storage.vectors.faiss.index as vi

    real = vi.training_threshold
    vi.training_threshold = lambda spec, tuning: 1  # type: ignore[assignment]
    try:
        built = index.build(np.arange(100), lambda ids: vectors[ids])
    finally:
        vi.training_threshold = real
    assert built.active == "Flat" and built.ntotal == 100
    assert index.training_failed_at == 100
    assert not index.wants_training(199)
    ids, scores = built.search(vectors[7], 5, lambda ids: vectors[ids])
    assert ids[0] == 7 and scores[0] == pytest.approx(1.0, abs=1e-5)


def test_ivf_pq_below_256_vectors_searches_exactly_restarts_and_trains_at_256(tmp_path: Path) -> None:
    # Before: the 50th upload trained PQ128x8 on 50 points (< 256 centroids): 500s, and no restart.
    settings = _settings(tmp_path)
    texts = [f"text number {i}" for i in range(300)]
    with TestClient(create_app(settings, encoder=FakeEncoder(dim=DIM))) as client:
        r = client.post("/v1/collections", json={"name": "w", "kind": "texts", "index": "IVF1,PQ128x8"})
        assert r.status_code == 201, r.text
        ids = _add(client, "w", texts[:70])
        found = {}
        for query in ids[:5]:
            status, body = _search(client, query)
            assert status == 200, body
            found[query] = [hit["id"] for hit in body["results"]]
    catalog = open_test_catalog(settings)
    try:
        assert catalog.store("w").store.index.active == "Flat"  # type: ignore[attr-defined]
    finally:
        catalog.close()
    for query, got in found.items():
        assert got == _exact(settings, ids, query, 10)  # exact, not approximate
    # The server starts again on that data dir, and the collection still answers exactly.
    with TestClient(create_app(settings, encoder=FakeEncoder(dim=DIM))) as client:
        status, body = _search(client, ids[3])
        assert status == 200 and [hit["id"] for hit in body["results"]] == found[ids[3]]
        ids += _add(client, "w", texts[70:260])
        status, body = _search(client, ids[-1])
        assert status == 200 and len(body["results"]) == 10
    catalog = open_test_catalog(settings)
    try:
        assert catalog.store("w").store.index.active == "IVF1,PQ128"  # type: ignore[attr-defined]  # trained at 256
    finally:
        catalog.close()


def _index_file(settings: Settings, name: str) -> Path:
    catalog = open_test_catalog(settings)
    try:
        collection_id = catalog.collection(name).id
    finally:
        catalog.close()
    (found,) = (settings.data_dir / "indexes").glob(f"*/{collection_id}.faiss")
    return found


def test_one_collection_whose_store_cannot_open_answers_503_and_the_server_serves_the_others(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    with TestClient(create_app(settings, encoder=FakeEncoder(dim=DIM))) as client:
        ids = {}
        for name in ("a", "b"):
            assert client.post("/v1/collections", json={"name": name, "kind": "texts"}).status_code == 201
            ids[name] = _add(client, name, [f"{name} text {i}" for i in range(5)])
    # A folder where the index file's lock should be: the store can be neither opened nor saved (a
    # damaged or foreign file at the index's own name is rebuilt from SQL instead: not a failure).
    broken = _index_file(settings, "a").with_suffix(".faiss.lock")
    broken.unlink(missing_ok=True)
    broken.mkdir()
    (broken / "x").write_bytes(b"x")
    with TestClient(create_app(settings, encoder=FakeEncoder(dim=DIM))) as client:  # it starts
        assert client.get("/readyz").status_code == 200
        status, body = _search(client, ids["a"][0])
        assert status == 503, body
        assert body["error"]["code"] == "collection_unavailable"
        assert "'a'" in body["error"]["message"] and str(broken) not in body["error"]["message"]
        assert _search(client, ids["b"][0])[0] == 200
        info = client.get("/v1/collections/a").json()
        assert info["degraded"] and "open" in info["degraded"]
        assert client.get("/v1/collections/b").json()["degraded"] is None
        metrics = client.get("/metrics").text
        assert 'cnclip_collection_degraded{collection="a",kind="texts"} 1.0' in metrics
        assert 'cnclip_collection_degraded{collection="b",kind="texts"} 0.0' in metrics
        # Writes to it still commit in SQL (its store catches up once it opens).
        added = _add(client, "a", ["a text added while degraded"])
        # Repaired: after its back-off it opens again, from SQL, with what was written meanwhile.
        shutil.rmtree(broken)
        deadline = time.monotonic() + 30
        while (status := _search(client, ids["a"][0], k=20)[0]) == 503:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        status, body = _search(client, ids["a"][0], k=20)
        assert status == 200 and added[0] in {hit["id"] for hit in body["results"]}
        assert client.get("/v1/collections/a").json()["degraded"] is None


def test_a_search_that_fails_inside_the_engine_degrades_that_collection_only(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    catalog = open_test_catalog(settings)
    try:
        with TestClient(create_app(settings, encoder=FakeEncoder(dim=DIM), catalog=catalog)) as client:
            ids = {}
            for name in ("a", "b"):
                assert client.post("/v1/collections", json={"name": name, "kind": "texts"}).status_code == 201
                ids[name] = _add(client, name, [f"{name} text {i}" for i in range(5)])
            store = catalog.store("a").store

            def explode(*args: object, **kwargs: object) -> None:
                raise RuntimeError("Error in faiss::IndexIDMap2::search: something native broke")

            store.search = explode  # type: ignore[method-assign]
            status, body = _search(client, ids["a"][0])
            assert status == 503 and body["error"]["code"] == "collection_unavailable", body
            assert "native" not in body["error"]["message"]
            assert _search(client, ids["b"][0])[0] == 200
            assert client.get("/v1/collections/a").json()["degraded"]
    finally:
        catalog.close()


def test_what_degrades_a_collection_and_how_long_it_waits() -> None:
    from indexer.errors import CollectionUnavailable, DatabaseUnavailable, VectorStoreBusy, VectorStoreUnavailable
    from indexer.storage.store_health import RETRY_FIRST_S, StoreHealth, is_collection_failure

    assert is_collection_failure(RuntimeError("faiss")) and is_collection_failure(IsADirectoryError(21, "x"))
    assert is_collection_failure(VectorStoreUnavailable("one Milvus collection"))
    assert not is_collection_failure(DatabaseUnavailable("sql away"))  # not the collection's fault
    assert not is_collection_failure(VectorStoreBusy("another process holds the Lite file"))
    health = StoreHealth()
    health.failed(1, "a", "open", RuntimeError("native"))
    with pytest.raises(CollectionUnavailable, match="'a'"):
        health.check(1)  # backing off: the engine is not touched again yet
    second = health.failed(1, "a", "open", RuntimeError("native"))
    record = health.get(1)
    assert record is not None and record.failures == 2
    assert record.retry_at - time.monotonic() > RETRY_FIRST_S * 1.5  # doubled
    assert "native" not in second.message
    health.failed(2, "b", "open", VectorStoreUnavailable("Milvus away"))
    health.check(2)  # an engine error is tried again at once, as before
    health.recovered(1)
    assert health.get(1) is None and set(health.all()) == {2}
