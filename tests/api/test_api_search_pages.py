"""Search that fits photos, through the API: a relevance cutoff, date orders, paging with totals, and
taken_at filters, on text, image and similar-item searches; hostile page parameters are 422. On FAISS
and on the real Milvus server (its filters run inside Milvus)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from api.config import Settings
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import api_client
from tests.support.engines import MILVUS_SERVER, engine_under_test

COUNT = 40
DAY0 = datetime(2015, 6, 1, 12, tzinfo=UTC)


def photo(i: int) -> bytes:
    """A distinct JPEG; two in three carry an EXIF DateTimeOriginal (UTC) spread over years, not in id order."""
    rng = np.random.default_rng(i)
    buffer = io.BytesIO()
    exif = Image.Exif()
    if i % 3:
        exif.get_ifd(0x8769)[0x9003] = (DAY0 + timedelta(days=(i * 97) % 1000)).strftime("%Y:%m:%d %H:%M:%S")
        exif.get_ifd(0x8769)[0x9011] = "+00:00"
    Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)).save(buffer, "JPEG", exif=exif.tobytes())
    return buffer.getvalue()


# Every test here only reads: one library of COUNT photos per engine serves the whole module (uploading
# it per test cost ~4 s on the real Milvus server, 90 s a run).
@pytest.fixture(scope="module", params=["faiss", MILVUS_SERVER])
def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path
) -> Iterator[TestClient]:
    data_dir = tmp_path_factory.mktemp("search-pages") / "data"
    settings = Settings(_env_file=None, model_dir=toy_model_dir, data_dir=data_dir, provider="cpu")
    settings = settings.model_copy(update=engine_under_test(request, str(request.param)).overrides())
    with api_client(settings, encoder=FakeEncoder(dim=32)) as c:
        assert c.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        for i in range(COUNT):
            r = c.post("/v1/collections/photos/items", files={"file": (f"p{i}.jpg", photo(i), "image/jpeg")})
            assert r.status_code == 201, r.text
        yield c


def everything(client: TestClient, query: str) -> list[dict]:
    """Every item with its score for `query` (relevance order), from one unfiltered search."""
    r = client.post("/v1/search/text", json={"query": query, "k": COUNT})
    assert r.status_code == 200 and len(r.json()["results"]) == COUNT
    return r.json()["results"]


def test_results_carry_when_they_were_taken(client: TestClient) -> None:
    results = everything(client, "海边")
    sources = {r["taken_at_source"] for r in results}
    assert sources == {"exif", "upload"}
    for r in results:
        i = int(client.get(f"/v1/items/{r['id']}").json()["id"]) - 1  # ids follow the upload order
        item = client.get(f"/v1/items/{r['id']}").json()
        assert item["taken_at"] == r["taken_at"] and item["taken_at_source"] == r["taken_at_source"]
        if i % 3:
            assert r["taken_at_source"] == "exif"
            assert datetime.fromisoformat(r["taken_at"]) == DAY0 + timedelta(days=(i * 97) % 1000)


def test_min_score_cuts_off_and_counts_what_it_hid(client: TestClient) -> None:
    results = everything(client, "海边")
    scores = [r["score"] for r in results]
    cutoff = float(np.median(scores))
    above = [r["id"] for r in results if r["score"] >= cutoff]
    r = client.post("/v1/search/text", json={"query": "海边", "k": 5, "min_score": cutoff}).json()
    assert [x["id"] for x in r["results"]] == above[:5]
    assert (r["total"], r["total_exact"], r["has_more"], r["next_offset"]) == (len(above), True, True, 5)
    assert r["below_cutoff"] == COUNT - len(above) and r["min_score"] == cutoff  # the pool holds every item
    # A page as deep as the list: the ones below the cutoff are counted, not shown.
    deep = client.post("/v1/search/text", json={"query": "海边", "k": 30, "min_score": cutoff}).json()
    assert len(deep["results"]) == len(above) and deep["has_more"] is False and deep["next_offset"] is None
    assert deep["below_cutoff"] == sum(1 for s in scores if s < cutoff)
    none = client.post("/v1/search/text", json={"query": "海边", "min_score": 1.0}).json()
    assert (none["results"], none["total"], none["total_exact"], none["below_cutoff"]) == ([], 0, True, COUNT)


def test_pages_of_every_order_add_up_to_the_whole_list(client: TestClient) -> None:
    results = everything(client, "雪山")
    cutoff = sorted(r["score"] for r in results)[8]  # 32 above
    above = [r for r in results if r["score"] >= cutoff]
    taken = sorted(above, key=lambda r: (-datetime.fromisoformat(r["taken_at"]).timestamp(), -r["score"]))
    added = sorted(above, key=lambda r: -r["id"])  # ids grow with upload time
    for sort, expected in [("relevance", above), ("taken", taken), ("added", added)]:
        seen: list[int] = []
        offset: int | None = 0
        while offset is not None:
            body = {"query": "雪山", "k": 7, "offset": offset, "min_score": cutoff, "sort": sort}
            page = client.post("/v1/search/text", json=body).json()
            assert page["total"] == len(above) and page["sort"] == sort and page["offset"] == offset
            seen += [x["id"] for x in page["results"]]
            offset = page["next_offset"]
        assert seen == [r["id"] for r in expected], sort
    assert [r["id"] for r in taken] != [r["id"] for r in above]  # the orders really differ


def test_plain_relevance_pages_and_has_more(client: TestClient) -> None:
    results = [r["id"] for r in everything(client, "猫")]
    first = client.post("/v1/search/text", json={"query": "猫", "k": 15}).json()
    second = client.post("/v1/search/text", json={"query": "猫", "k": 15, "offset": 15}).json()
    last = client.post("/v1/search/text", json={"query": "猫", "k": 15, "offset": 30}).json()
    assert [x["id"] for x in first["results"] + second["results"] + last["results"]] == results
    assert (first["has_more"], first["next_offset"], first["total_exact"]) == (True, 15, False)
    assert first["total"] >= 16  # a lower bound: there is at least one more
    assert (last["has_more"], last["next_offset"], last["total"], last["total_exact"]) == (False, None, COUNT, True)


def test_taken_filters_on_text_image_and_similar(client: TestClient) -> None:
    results = everything(client, "花")
    start, end = DAY0 + timedelta(days=200), DAY0 + timedelta(days=600)

    def inside(r: dict) -> bool:
        return r["taken_at_source"] == "exif" and start <= datetime.fromisoformat(r["taken_at"]) <= end

    expected = [r["id"] for r in results if inside(r)]
    assert 5 < len(expected) < COUNT
    window = {"taken_from": start.isoformat(), "taken_to": end.isoformat()}
    r = client.post("/v1/search/text", json={"query": "花", "k": COUNT, "filters": window})
    assert [x["id"] for x in r.json()["results"]] == expected
    image = client.post(
        "/v1/search/image", files={"file": ("q.jpg", photo(1), "image/jpeg")}, data={"k": COUNT, **window}
    )
    assert image.status_code == 200, image.text
    assert sorted(x["id"] for x in image.json()["results"]) == sorted(expected)
    item = results[0]["id"]
    similar = client.get(f"/v1/items/{item}/similar", params={"k": COUNT, "sort": "taken", **window})
    assert similar.status_code == 200, similar.text
    got = similar.json()["results"]
    assert sorted(x["id"] for x in got) == sorted(set(expected) - {item})
    stamps = [x["taken_at"] for x in got]
    assert stamps == sorted(stamps, reverse=True)


def test_image_and_similar_searches_page_and_cut_off_too(client: TestClient) -> None:
    similar = client.get("/v1/items/1/similar", params={"k": 39}).json()["results"]
    cutoff = similar[9]["score"]
    page = client.get("/v1/items/1/similar", params={"k": 4, "offset": 4, "min_score": cutoff}).json()
    assert [x["id"] for x in page["results"]] == [x["id"] for x in similar[4:8]]
    assert (page["total"], page["has_more"], page["next_offset"]) == (10, True, 8)
    image = client.post(
        "/v1/search/image",
        files={"file": ("q.jpg", photo(3), "image/jpeg")},
        data={"k": 3, "offset": 1, "min_score": -1, "sort": "added"},
    ).json()
    assert [x["id"] for x in image["results"]] == [39, 38, 37] and image["total"] == COUNT


def test_a_page_past_the_end_of_the_list_is_cut_short_not_refused(client: TestClient) -> None:
    r = client.post("/v1/search/text", json={"query": "猫", "k": 200, "offset": 990})
    assert r.status_code == 200 and r.json()["results"] == [] and r.json()["has_more"] is False


BAD_PAGES = [
    {"offset": 1000},  # result lists end at 1000
    {"offset": -1},
    {"offset": 10**12},
    {"min_score": 1.5},
    {"min_score": "NaN"},
    {"min_score": "high"},
    {"sort": "date"},
    {"k": 0},
]


@pytest.mark.parametrize("bad", BAD_PAGES)
def test_hostile_page_parameters_are_422_on_every_search(client: TestClient, bad: dict) -> None:
    text = client.post("/v1/search/text", json={"query": "猫", **bad})
    image = client.post("/v1/search/image", files={"file": ("q.jpg", photo(1), "image/jpeg")}, data=bad)
    similar = client.get("/v1/items/1/similar", params=bad)
    for response in (text, image, similar):
        assert response.status_code == 422, (bad, response.status_code, response.text)
        assert response.json()["error"]["code"] == "invalid_input"


@pytest.mark.parametrize("bad", ["yesterday", "2020-13-01", "9" * 40])
def test_hostile_dates_are_422(client: TestClient, bad: str) -> None:
    text = client.post("/v1/search/text", json={"query": "猫", "filters": {"taken_from": bad}})
    image = client.post("/v1/search/image", files={"file": ("q.jpg", photo(1), "image/jpeg")}, data={"taken_to": bad})
    similar = client.get("/v1/items/1/similar", params={"taken_from": bad})
    for response in (text, image, similar):
        assert response.status_code == 422, (bad, response.text)


def test_collections_suggest_a_cutoff_only_for_models_measured_or_known(client: TestClient) -> None:
    from retrieval.relevance import suggested_min_scores

    assert client.get("/v1/collections").json()[0]["suggested_min_score"] == {}  # the fake model: unknown
    assert suggested_min_scores("cnclip-demo@1de533a782a0") == {"text": 0.25, "image": 0.6}
    assert suggested_min_scores("cnclip-ViT-B-16@0123456789ab") == {"text": 0.3, "image": 0.7}
