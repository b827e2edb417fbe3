"""Queries that exclude (indexer/domain/exclusion.py) through the API with a fake model: the field on text,
image and similar-item searches, its validation (422 naming the field, the text rule of api/values.py),
the rule's arithmetic, and what the result list keeps (cutoff, totals, the query item left out). The
numbers on real pictures are in tests/indexer/service/test_search_exclude_demo.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient

from api.config import Settings
from api.schemas import MAX_QUERY_CHARS
from indexer.domain.exclusion import (
    MAX_EXCLUDED,
    MAX_EXCLUDED_CHARS,
    PENALTY_MARGIN,
    PENALTY_WEIGHT,
    Exclusion,
    excluded_texts,
    penalties,
    push_away,
)
from indexer.domain.records import Hit
from retrieval.errors import InvalidInput
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import GALLERY, api_client, image_bytes, seed


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with api_client(settings, encoder=FakeEncoder()) as c:
        seed(c)
        yield c


def _text(client: TestClient, body: dict) -> dict:
    r = client.post("/v1/search/text", json={"k": len(GALLERY), **body})
    assert r.status_code == 200, r.text
    return r.json()


def _fake_scores(client: TestClient, query: str) -> dict[int, float]:
    return {r["id"]: r["score"] for r in _text(client, {"query": query})["results"]}


def test_a_text_search_pushes_away_what_the_excluded_text_matches(client: TestClient) -> None:
    plain = _text(client, {"query": "海边的日落"})
    away = _text(client, {"query": "海边的日落", "exclude": ["人"]})
    assert len(plain["results"]) == len(away["results"]) == len(GALLERY)
    # Recompute the rule from the fake model's own cosines: the same order and scores as the API's.
    query, person = _fake_scores(client, "海边的日落"), _fake_scores(client, "人")
    ids = list(query)
    penalty = penalties(np.array([query[i] for i in ids]), np.array([[person[i]] for i in ids]))
    expected = sorted(zip(ids, np.array([query[i] for i in ids]) - penalty, strict=True), key=lambda p: -p[1])
    assert [r["id"] for r in away["results"]] == [i for i, _ in expected]
    assert [r["score"] for r in away["results"]] == pytest.approx([s for _, s in expected], abs=1e-5)
    assert penalty.max() > 0  # something was pushed, so the orders differ
    assert [r["id"] for r in away["results"]] != [r["id"] for r in plain["results"]]
    # an item the excluded text does not match keeps its cosine
    for r in away["results"]:
        if penalty[ids.index(r["id"])] == 0:
            assert r["score"] == pytest.approx(query[r["id"]], abs=1e-6)


def test_an_exclusion_is_stripped_and_kept_once(client: TestClient) -> None:
    once = _text(client, {"query": "海边", "exclude": ["人"]})["results"]
    again = _text(client, {"query": "海边", "exclude": [" 人 ", "人"]})["results"]
    assert once == again


def test_similar_items_exclude_and_leave_the_item_out(client: TestClient) -> None:
    item = _text(client, {"query": "海边"})["results"][0]["id"]
    plain = client.get(f"/v1/items/{item}/similar", params={"k": 10}).json()["results"]
    r = client.get(f"/v1/items/{item}/similar", params=[("k", "10"), ("exclude", "人"), ("exclude", "猫")])
    assert r.status_code == 200, r.text
    ids = [x["id"] for x in r.json()["results"]]
    assert item not in ids and sorted(ids) == sorted(x["id"] for x in plain)  # a small gallery: the same set
    assert ids != [x["id"] for x in plain]


def _by_rule(query: dict[int, float], excluded: list[dict[int, float]]) -> list[tuple[int, float]]:
    ids = list(query)
    scores = np.array([query[i] for i in ids])
    penalty = penalties(scores, np.array([[e[i] for e in excluded] for i in ids]))
    return sorted(zip(ids, scores - penalty, strict=True), key=lambda p: -p[1])


def test_an_image_search_excludes(client: TestClient) -> None:
    files = {"file": ("q.png", image_bytes(GALLERY[0][2]), "image/png")}
    plain = client.post("/v1/search/image", files=files, data={"k": "10"}).json()["results"]
    r = client.post("/v1/search/image", files=files, data={"k": "10", "exclude": ["人", "狗"]})
    assert r.status_code == 200, r.text
    expected = _by_rule({x["id"]: x["score"] for x in plain}, [_fake_scores(client, "人"), _fake_scores(client, "狗")])
    assert [(x["id"], x["score"]) for x in r.json()["results"]] == [
        (i, pytest.approx(s, abs=1e-5)) for i, s in expected
    ]


BAD = [
    ["x"] * (MAX_EXCLUDED + 1),
    [""],
    ["   "],
    ["a\x00b"],
    ["x" * (MAX_QUERY_CHARS + 1)],
    "人",
    [1],
    [None],
    [["人"]],
]


@pytest.mark.parametrize("exclude", BAD, ids=range(len(BAD)))
def test_a_bad_exclusion_is_422_naming_the_field(client: TestClient, exclude: object) -> None:
    r = client.post("/v1/search/text", json={"query": "海边", "exclude": exclude})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["message"].startswith("exclude")


def test_a_lone_surrogate_in_an_exclusion_is_422(client: TestClient) -> None:
    body = json.dumps({"query": "海边", "exclude": ["人\ud800"]})  # ensure_ascii: written as an escape
    r = client.post("/v1/search/text", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["message"].startswith("exclude.0")


@pytest.mark.parametrize("exclude", [["x"] * (MAX_EXCLUDED + 1), [""], ["a\x00"], ["x" * (MAX_QUERY_CHARS + 1)]])
def test_bad_exclusions_on_image_and_similar_searches_are_422(client: TestClient, exclude: list[str]) -> None:
    files = {"file": ("q.png", image_bytes(GALLERY[0][2]), "image/png")}
    r = client.post("/v1/search/image", files=files, data={"exclude": exclude})
    assert r.status_code == 422 and "exclude" in r.json()["error"]["message"], r.text
    r = client.get("/v1/items/1/similar", params=[("exclude", e) for e in exclude])
    assert r.status_code == 422 and "query.exclude" in r.json()["error"]["message"], r.text


def test_the_cutoff_cuts_the_penalised_score_and_totals_stay_true(client: TestClient) -> None:
    away = _text(client, {"query": "海边", "exclude": ["人"]})["results"]
    cutoff = (away[2]["score"] + away[3]["score"]) / 2
    r = _text(client, {"query": "海边", "exclude": ["人"], "k": 2, "min_score": cutoff})
    assert [x["id"] for x in r["results"]] == [x["id"] for x in away[:2]]
    assert (r["total"], r["total_exact"], r["has_more"]) == (3, True, True)
    assert r["below_cutoff"] == len(GALLERY) - 3


def test_the_service_checks_exclusions_too() -> None:
    assert excluded_texts(None) == excluded_texts([]) == ()
    assert excluded_texts([" 人", "人 ", "车"]) == ("人", "车")
    for bad in (["x"] * (MAX_EXCLUDED + 1), [" "], ["a\x00"], ["\ud800"], ["x" * (MAX_EXCLUDED_CHARS + 1)], "人"):
        with pytest.raises(InvalidInput):
            excluded_texts(bad)  # type: ignore[arg-type]
    assert MAX_EXCLUDED_CHARS == MAX_QUERY_CHARS  # an excluded text is a query's length at most


def test_the_rule_by_hand() -> None:
    scores = np.array([0.9, 0.8, 0.7, 0.6])
    excluded = np.array([[0.9], [0.1], [0.1], [0.1]])  # only the first matches the excluded text
    z_first = (0.9 - excluded.mean()) / excluded.std()
    expected = PENALTY_WEIGHT * scores.std() * max(0.0, z_first - PENALTY_MARGIN)
    assert penalties(scores, excluded) == pytest.approx([expected, 0, 0, 0])
    # two excluded texts: the larger penalty counts, not the sum
    two = np.hstack([excluded, excluded])
    assert penalties(scores, two) == pytest.approx(penalties(scores, excluded))
    # no spread (every candidate matches alike) or one candidate: nothing is pushed
    assert not penalties(scores, np.full((4, 1), 0.5)).any()
    assert not penalties(scores[:1], excluded[:1]).any()


def test_push_away_reorders_and_keeps_dims_honest() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(6, 8)).astype(np.float32)
    text = vectors[0] + 0.01 * rng.normal(size=8)  # the best hit is the excluded concept itself
    hits = [Hit(i + 1, 0.9 - 0.01 * i) for i in range(6)]
    away = push_away(hits, vectors, Exclusion.of(["x"], text[None, :], "key"))
    assert away[0].id != 1 and {h.id for h in away} == {h.id for h in hits}
    assert [h.score for h in away] == sorted((h.score for h in away), reverse=True)
    with pytest.raises(InvalidInput):
        push_away(hits, vectors[:, :4], Exclusion.of(["x"], text[None, :], "key"))
    # every candidate deleted meanwhile (no vectors): nothing to push, nothing fails
    assert [h.id for h in push_away(hits, np.zeros((6, 0)), Exclusion.of(["x"], text[None, :], "key"))] == [
        h.id for h in hits
    ]
