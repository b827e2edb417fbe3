"""Queries that exclude, measured on the demo gallery (`cnclip demo --no-serve`, the shipped model): the
rule of indexer/domain/exclusion.py must take the excluded colour out of the top 30 and keep the queried shape,
through the API (text, image and similar-item searches) and the CLI. The truth is the demo dataset's own
record of each picture (demo/dataset.py attributes, matched by caption), not the model.

Measured when the rule was chosen (λ 4, margin 1 sd; docs/api.md "Queries that exclude"):
- "星星" excluding "红色", top 30: 2 red without, 0 with; 30 stars both ways.
- every <shape> excluding every <colour> (70 pairs), top 30: 210 results of the colour without, 0 with;
  results of the shape without the colour 1890 without, 2100 with (all 30 every time).
- "similar" to each of the 35 red pictures excluding "红色", top 30: 364 red results (of 1050) without, 0
  with; results of the picture's shape that are not red 499 without, 656 with.
- an uploaded red star (demo-0030.png) excluding "红色", top 30: 12–13 red without (ties); with, 1: the picture
  itself (it is in the gallery: cosine 1, more than the penalty takes), and stars 18 (5 red) -> 22.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.app import create_app
from api.config import Settings
from cli.main import build_cli
from demo import dataset, vocabulary
from demo.gallery import GALLERY_SEED, GALLERY_SIZE, IMAGE_COLLECTION, describe
from retrieval.config import SHIPPED_MODEL_DIR

K = 30


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("exclude-demo")
    result = CliRunner().invoke(build_cli(), ["demo", "--no-serve"], env=_env(data_dir))
    assert result.exit_code == 0, result.output
    return data_dir


def _env(data_dir: Path) -> dict[str, str]:
    return {"CNCLIP_DATA_DIR": str(data_dir), "CNCLIP_PROVIDER": "cpu", "CNCLIP_MODEL_DIR": str(SHIPPED_MODEL_DIR)}


@pytest.fixture(scope="module")
def client(demo_dir: Path) -> Iterator[TestClient]:
    settings = Settings(_env_file=None, data_dir=demo_dir, model_dir=SHIPPED_MODEL_DIR, provider="cpu")
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def truth() -> dict[str, vocabulary.Attributes]:
    """caption -> the attributes the dataset drew the picture with."""
    return {describe(s.attributes): s.attributes for s in dataset.demo_gallery(GALLERY_SIZE, GALLERY_SEED)}


def _text(client: TestClient, query: str, exclude: list[str], **extra: object) -> dict:
    body = {"query": query, "k": K, "collection": IMAGE_COLLECTION, "exclude": exclude, **extra}
    r = client.post("/v1/search/text", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _count(results: list[dict], truth: dict[str, vocabulary.Attributes], *, colour: str, shape: str) -> tuple[int, int]:
    """(results of `colour`, results of `shape` that are not `colour`)."""
    attrs = [truth[r["caption"]] for r in results]
    return sum(a.colour == colour for a in attrs), sum(a.shape == shape and a.colour != colour for a in attrs)


def test_stars_excluding_red_leave_no_red_in_the_top_30(client: TestClient, truth: dict) -> None:
    plain = _text(client, "星星", [])["results"]
    away = _text(client, "星星", ["红色"])["results"]
    assert len(plain) == len(away) == K
    assert _count(plain, truth, colour="红色", shape="星形") == (2, 28)  # red stars rank among the stars
    assert _count(away, truth, colour="红色", shape="星形") == (0, 30)  # gone, and 30 other stars instead
    assert all(truth[r["caption"]].shape == "星形" for r in away)


def test_every_shape_excluding_every_colour(client: TestClient, truth: dict) -> None:
    plain_colour = plain_kept = away_colour = away_kept = 0
    for shape, words in vocabulary.SHAPES.items():
        for colour in vocabulary.COLOURS:
            c, s = _count(_text(client, words[0], [])["results"], truth, colour=colour, shape=shape)
            plain_colour, plain_kept = plain_colour + c, plain_kept + s
            c, s = _count(_text(client, words[0], [colour])["results"], truth, colour=colour, shape=shape)
            away_colour, away_kept = away_colour + c, away_kept + s
    assert (plain_colour, plain_kept) == (210, 1890)
    assert away_colour == 0
    assert away_kept >= 2090  # measured 2100: every result the shape, none the colour


def test_similar_and_image_searches_exclude_too(client: TestClient, demo_dir: Path, truth: dict) -> None:
    items = [client.get(f"/v1/items/{i}").json() for i in range(1, GALLERY_SIZE + 1)]
    reds = [(item["id"], truth[item["caption"]].shape) for item in items if truth[item["caption"]].colour == "红色"]
    assert len(reds) == 35
    plain = away = plain_kept = away_kept = 0
    for item_id, shape in reds:
        results = client.get(f"/v1/items/{item_id}/similar", params={"k": K}).json()["results"]
        c, s = _count(results, truth, colour="红色", shape=shape)
        plain, plain_kept = plain + c, plain_kept + s
        r = client.get(f"/v1/items/{item_id}/similar", params={"k": K, "exclude": "红色"})
        assert r.status_code == 200, r.text
        assert len(r.json()["results"]) == K and item_id not in [x["id"] for x in r.json()["results"]]
        c, s = _count(r.json()["results"], truth, colour="红色", shape=shape)
        away, away_kept = away + c, away_kept + s
    # Measured 361–364 red results without the exclusion (ties among the demo's equal-scoring pictures
    # fall either way between runs), and 0 with it; the same shape not red rose from ~499 to 656.
    assert plain >= 300 and away == 0
    assert away_kept >= 640 and away_kept > plain_kept

    data = (demo_dir / "demo" / "images" / "demo-0030.png").read_bytes()
    form = {"k": str(K), "collection": IMAGE_COLLECTION}
    found = {}
    for exclude in ([], ["红色"]):
        r = client.post(
            "/v1/search/image", files={"file": ("q.png", data, "image/png")}, data={**form, "exclude": exclude}
        )
        assert r.status_code == 200, r.text
        found[bool(exclude)] = r.json()["results"]
    red = [x["filename"] for x in found[True] if truth[x["caption"]].colour == "红色"]
    # Measured (13, 13) and (12, 14) on the same gallery: the demo draws many pictures that score equal to
    # the query, and which of them make the top 30 falls either way with the CPU's summation order. The
    # exclusion's claim is the difference, not the tie-break: about a dozen red without, one with.
    red_plain, stars_not_red = _count(found[False], truth, colour="红色", shape="星形")
    assert 10 <= red_plain <= 16 and stars_not_red >= 10, (red_plain, stars_not_red)
    assert red == ["demo-0030.png"]  # only the query picture itself (cosine 1)
    assert sum(truth[x["caption"]].shape == "星形" for x in found[True]) == 22


@pytest.mark.parametrize("extra", [{}, {"sort": "taken"}, {"min_score": 0.3}, {"sort": "added", "min_score": 0.2}])
def test_pages_of_an_excluding_search_cut_one_list(client: TestClient, extra: dict) -> None:
    whole = _text(client, "星星", ["红色"], **extra, k=60)
    pages: list[dict] = []
    offset: int | None = 0
    while offset is not None:
        r = client.post(
            "/v1/search/text",
            json={
                "query": "星星",
                "exclude": ["红色"],
                "collection": IMAGE_COLLECTION,
                "k": 7,
                "offset": offset,
                **extra,
            },
        ).json()
        assert (r["total"], r["total_exact"]) == (whole["total"], whole["total_exact"])
        pages += r["results"]
        offset = r["next_offset"] if len(pages) < 60 else None
    assert [p["id"] for p in pages[:60]] == [p["id"] for p in whole["results"]]
    if "min_score" in extra:  # the cutoff cuts the penalised score
        assert all(p["score"] >= extra["min_score"] for p in pages)
        assert whole["below_cutoff"] > _text(client, "星星", [], **extra, k=60)["below_cutoff"]


def test_the_cli_excludes_repeatably(demo_dir: Path, truth: dict) -> None:
    def search(*args: str) -> list[dict]:
        argv = ["search", "星星", "--collection", IMAGE_COLLECTION, "-k", str(K), "--json", *args]
        result = CliRunner().invoke(build_cli(), argv, env=_env(demo_dir))
        assert result.exit_code == 0, result.output
        return json.loads(result.output)["results"]

    colours = lambda rs: [truth[r["caption"]].colour for r in rs]  # noqa: E731
    assert colours(search()).count("红色") == 2
    assert colours(search("--exclude", "红色")).count("红色") == 0
    both = colours(search("--exclude", "红色", "-x", "蓝色"))
    assert both.count("红色") == both.count("蓝色") == 0 and len(both) == K
    assert "蓝色" in colours(search("--exclude", "红色"))  # the second exclusion did the work


def _cache(client: TestClient) -> tuple[float, float]:
    """(hits, misses) of the encoder's query cache, from /metrics."""
    text = client.get("/metrics").text
    value = lambda name: float(re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]  # noqa: E731
    return value("cnclip_query_cache_hits_total"), value("cnclip_query_cache_misses_total")


def test_excluded_texts_are_cached_as_texts_and_never_answer_for_another_search(client: TestClient) -> None:
    hits, misses = _cache(client)  # texts no other test here asks for
    away = _text(client, "爱心", ["粉色的"])["results"]
    assert _cache(client) == (hits, misses + 2)  # the query and the excluded text: two new entries
    plain = _text(client, "粉色的", [])["results"]  # the excluded text's vector, now a query's
    assert _cache(client) == (hits + 1, misses + 2)
    assert _text(client, "爱心", ["粉色的"])["results"] == away  # every text from the cache, the same page
    assert _cache(client) == (hits + 3, misses + 2)
    assert _text(client, "爱心", [])["results"] != away  # results themselves are never cached
    assert plain != away


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-x", " "], "an excluded text is empty"),
        (["-x", "a\x00b"], "an excluded text contains a NUL character"),
        ([a for i in range(9) for a in ("-x", f"色{i}")], "exclude holds at most 8 texts, not 9"),
        (["-x", "字" * 513], "at most 512 characters"),
    ],
)
def test_the_cli_refuses_a_bad_exclusion_in_one_line(demo_dir: Path, args: list[str], said: str) -> None:
    result = CliRunner().invoke(build_cli(), ["search", "星星", "-c", IMAGE_COLLECTION, *args], env=_env(demo_dir))
    assert result.exit_code != 0 and said in result.output, result.output
    assert "Traceback" not in result.output
