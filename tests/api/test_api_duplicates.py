"""GET /v1/collections/{name}/duplicates: the answer's shape (tiers, keeper first, scores, urls and no
server paths), deleting a member through DELETE /v1/items/{id}, the read/write key rules, a partial
answer completed by the next requests, 429 while another search runs, and every hostile parameter
answered with a 4xx in the API's error shape, never a 500."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from api.config import Settings
from indexer.domain import near_vectors
from indexer.domain.duplicates import FileCopy
from indexer.domain.records import NewImage, NewText
from indexer.service import duplicates
from indexer.storage.catalog import SqlCatalog
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import api_client, open_test_catalog
from tests.support.indexer_helpers import jpeg, near, service_for, unit

KEY = "s3cret-key"
URL = "/v1/collections/photos/duplicates"


@pytest.fixture
def catalog(settings: Settings) -> Iterator[SqlCatalog]:
    """`photos`: a resized pair (near hashes), a similar pair, an upload with a copy on disk, loners;
    `words`: a text collection."""
    cat = open_test_catalog(settings)
    service = service_for(cat, FakeEncoder())
    service.create("photos", "images")
    rng = np.random.default_rng(7)
    a, b, c = unit(rng.standard_normal((3, 32)))
    h = 0x0F0F_0F0F_1234_5678
    images = [
        NewImage(jpeg(1, (64, 48)), caption="原图", phash=h),
        NewImage(jpeg(2, (32, 24)), caption="缩小", phash=h ^ 0b11),
        NewImage(jpeg(3), caption="连拍一", phash=0),
        NewImage(jpeg(4), caption="连拍二", phash=0x7777_7777_7777_7777),
        NewImage(jpeg(5), caption="有副本", phash=0x5555_5555_5555_5555),
        NewImage(jpeg(6), caption="孤单", phash=0x3333_3333_3333_3333),
    ]
    vectors = np.stack([a, near(a, rng, 0.99), b, near(b, rng, 0.97), c, unit(rng.standard_normal(32))])
    service.writes.add_images("photos", images, vectors)
    copy_sha = cat.get_many([5])[0].sha256 or ""
    root = settings.data_dir / "library"
    service.duplicates.record_copies(
        "photos", [FileCopy(copy_sha, str(root / "2019" / "copy.jpg"), str(root), 99, 1.6e9)]
    )
    service.create("words", "texts")
    service.writes.add_texts("words", [NewText("一只猫")], FakeEncoder().embed_texts_sync(["一只猫"]))
    yield cat
    cat.close()


@pytest.fixture
def client(settings: Settings, catalog: SqlCatalog) -> Iterator[TestClient]:
    with api_client(settings, catalog=catalog) as c:
        yield c


def test_the_three_tiers_keeper_first_with_scores_and_no_server_paths(client: TestClient) -> None:
    r = client.get(URL)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["counts"] == {"identical": 1, "resized": 1, "similar": 1} and body["total"] == 3
    assert [g["tier"] for g in body["groups"]] == ["identical", "resized", "similar"]
    assert body["complete"] and body["unhashed"] == 0 and body["has_more"] is False and body["next_offset"] is None
    assert (body["similar_threshold"], body["similar_threshold_source"]) == (0.95, "unmeasured")
    identical, resized, similar = body["groups"]
    assert [(m["copy_of_item"], m["keeper"], m["filename"], m["path"]) for m in identical["members"]] == [
        (False, True, None, None),  # an upload: no file name
        (True, False, "copy.jpg", "2019/copy.jpg"),  # relative to the folder it was found in
    ]
    assert {m["id"] for m in identical["members"]} == {identical["keeper"]}
    assert [m["caption"] for m in resized["members"]] == ["原图", "缩小"]  # 64×48 beats 32×24
    keeper, other = resized["members"]
    assert keeper["keeper"] and keeper["id"] == resized["keeper"] and keeper["score"] == 1.0
    assert other["hamming"] == 2 and other["score"] == pytest.approx(0.99, abs=1e-3)
    assert (keeper["width"], keeper["height"], other["width"], other["height"]) == (64, 48, 32, 24)
    assert keeper["thumbnail_url"] == f"/v1/items/{keeper['id']}/thumbnail" and keeper["size"] > 0
    assert keeper["taken_at"] is not None and keeper["taken_at_source"] == "upload"
    assert similar["members"][1]["score"] == pytest.approx(0.97, abs=1e-3)
    assert str(Path("/").resolve()) + "tmp" not in r.text and "/library/" not in r.text  # never a server path
    only = client.get(URL, params={"tier": "similar"}).json()
    assert [g["tier"] for g in only["groups"]] == ["similar"] and only["total"] == 1


def test_deleting_a_member_through_the_item_route_updates_the_groups(client: TestClient) -> None:
    similar = client.get(URL, params={"tier": "similar"}).json()["groups"][0]
    member = similar["members"][1]["id"]
    assert client.delete(f"/v1/items/{member}").json() == {"deleted": 1}
    after = client.get(URL).json()
    assert after["counts"]["similar"] == 0 and after["total"] == 2
    assert client.get(f"/v1/items/{member}").status_code == 404


def test_pages_and_next_offset(client: TestClient) -> None:
    first = client.get(URL, params={"limit": 2}).json()
    assert [g["tier"] for g in first["groups"]] == ["identical", "resized"]
    assert first["has_more"] and first["next_offset"] == 2
    second = client.get(URL, params={"limit": 2, "offset": 2}).json()
    assert [g["tier"] for g in second["groups"]] == ["similar"] and not second["has_more"]
    assert client.get(URL, params={"offset": 50}).json()["groups"] == []


def test_reads_need_the_key_only_when_configured_and_deletes_always(settings: Settings, catalog: SqlCatalog) -> None:
    with api_client(settings.model_copy(update={"api_key": SecretStr(KEY)}), catalog=catalog) as c:
        assert c.get(URL).status_code == 200  # reads are open
        member = c.get(URL, params={"tier": "similar"}).json()["groups"][0]["members"][1]["id"]
        assert c.delete(f"/v1/items/{member}").status_code == 401
        assert c.delete(f"/v1/items/{member}", headers={"X-API-Key": KEY}).status_code == 200
    locked = settings.model_copy(update={"api_key": SecretStr(KEY), "require_key_for_reads": True})
    with api_client(locked, catalog=catalog) as c:
        r = c.get(URL)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert c.get(URL, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_a_partial_answer_says_so_and_the_next_requests_finish_it(
    settings: Settings, catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(near_vectors, "QUERY_CHUNK", 50)
    rng = np.random.default_rng(8)
    service_for(catalog, FakeEncoder()).writes.add_images(
        "photos", [NewImage(jpeg(100 + i)) for i in range(200)], unit(rng.standard_normal((200, 32)))
    )
    # The vectors are random, not the model's: pin the threshold (a calibration would measure noise).
    pinned = settings.model_copy(update={"duplicate_time_budget_s": 1e-6, "duplicate_threshold": 0.95})
    with api_client(pinned, catalog=catalog) as c:
        bodies = [c.get(URL).json()]
        while not bodies[-1]["complete"]:
            bodies.append(c.get(URL).json())
    assert [b["examined"] for b in bodies] == [50, 100, 150, 200, 205]
    assert all(b["searchable"] == 205 for b in bodies)  # the resized pair counts once


def test_another_search_in_progress_is_a_429_with_retry_after(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(duplicates, "LOCK_WAIT_S", 0.05)
    lock = client.app.state.service.duplicates.finder._lock  # type: ignore[attr-defined]
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(5)
    try:
        r = client.get(URL)
    finally:
        release.set()
        thread.join()
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"]["code"] == "overloaded"
    assert client.get(URL).status_code == 200


HOSTILE = [
    ("tier", "bogus"),
    ("tier", "ALL"),
    ("tier", ""),
    ("limit", "0"),
    ("limit", "-1"),
    ("limit", "101"),
    ("limit", "100000000000000000000000000000"),
    ("limit", "abc"),
    ("limit", "1.5"),
    ("limit", ""),
    ("limit", "NaN"),
    ("offset", "-1"),
    ("offset", "1000001"),
    ("offset", "9" * 400),
    ("offset", "1e3"),
    ("offset", "\u0661"),  # an Arabic-Indic digit one
]


@pytest.mark.parametrize(("param", "value"), HOSTILE, ids=[f"{p}={v[:12]!r}" for p, v in HOSTILE])
def test_a_hostile_parameter_is_a_422_in_the_error_shape(client: TestClient, param: str, value: str) -> None:
    r = client.get(URL, params={param: value})
    assert r.status_code == 422, r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == "invalid_input" and param in body["error"]["message"]


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/v1/collections/nothing/duplicates", 404, "not_found"),
        ("/v1/collections/NOTHING/duplicates", 404, "not_found"),
        ("/v1/collections/words/duplicates", 422, "invalid_input"),
        ("/v1/collections/a%20b/duplicates", 422, "invalid_input"),
        ("/v1/collections/" + "x" * 300 + "/duplicates", 422, "invalid_input"),
        ("/v1/collections/%00/duplicates", 422, "invalid_input"),
    ],
)
def test_unknown_text_and_malformed_collections(client: TestClient, path: str, status: int, code: str) -> None:
    r = client.get(path)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code


def test_the_collection_name_is_case_insensitive_and_other_methods_are_405(client: TestClient) -> None:
    assert client.get("/v1/collections/PHOTOS/duplicates").json()["collection"] == "photos"
    r = client.post(URL)
    assert r.status_code == 405 and r.headers["Allow"] == "GET"
