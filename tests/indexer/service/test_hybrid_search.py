"""Text and hybrid search (indexer/service/text_search.py) through the API with a fake model and texts
stored straight through the catalog's TextStore: the modes and their default, the fusion's promises
(text matches first, the CLIP order untouched when no text matches), quoted parts as a hard filter,
`matched_text` spans, and that cutoff, filters, paging, orders and exclusions keep their meaning.
Real OCR on rendered signs is tests/system/test_ocr_search.py."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from fastapi.testclient import TestClient

from api.config import Settings
from indexer.domain.item_texts import RecognisedText, TextLine
from indexer.domain.text_grams import normalize_text
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import GALLERY, api_client, open_test_catalog, seed

# caption of a GALLERY picture -> the text "recognised" in it
TEXTS = {
    "穿红色裙子的女孩": "北京烤鸭\n全聚德",
    "草地上的小狗": "烤鸭 烤鸭",
    "黄色的出租车": "出口 B",
    "一只黑猫": "会议室 3F\n9:00 开会",
    "蓝天下的海滩": "",
}


def _recognised(text: str) -> RecognisedText:
    box = ((0.0, 0.0), (9.0, 0.0), (9.0, 4.0), (0.0, 4.0))
    return RecognisedText(tuple(TextLine(line, box, 0.95) for line in text.split("\n") if line), "test")


@pytest.fixture
def app(settings: Settings) -> Iterator[tuple[TestClient, dict[str, int]]]:
    catalog = open_test_catalog(settings)
    try:
        with api_client(settings, catalog=catalog) as client:
            ids = seed(client)
            catalog.texts.put_texts("photos", {ids[c]: _recognised(t) for c, t in TEXTS.items()})
            catalog.texts.set_ocr("photos", True)
            yield client, ids
    finally:
        catalog.close()


def _search(client: TestClient, query: str, **fields: object) -> dict:
    r = client.post("/v1/search/text", json={"query": query, "k": len(GALLERY), **fields})
    assert r.status_code == 200, r.text
    return r.json()


def _ids(response: dict) -> list[int]:
    return [r["id"] for r in response["results"]]


def _holding(ids: dict[str, int], piece: str) -> set[int]:
    return {ids[c] for c, t in TEXTS.items() if normalize_text(piece) in normalize_text(t)}


def test_the_mode_defaults_to_hybrid_where_text_is_recognised(app: tuple[TestClient, dict[str, int]]) -> None:
    client, ids = app
    assert _search(client, "烤鸭")["mode"] == "hybrid"
    assert _search(client, "烤鸭", mode="clip")["mode"] == "clip"
    r = client.post("/v1/search/text", json={"query": "烤鸭", "mode": "ocr"})
    assert r.status_code == 422 and "mode" in r.text


def test_a_collection_without_ocr_searches_by_clip(settings: Settings) -> None:
    with api_client(settings) as client:
        seed(client)
        plain = _search(client, "烤鸭")
        assert plain["mode"] == "clip"
        assert plain["results"] == _search(client, "烤鸭", mode="clip")["results"]
        assert all(r["matched_text"] is None for r in plain["results"])


def test_text_matches_come_first_with_their_span(app: tuple[TestClient, dict[str, int]]) -> None:
    client, ids = app
    hybrid = _search(client, "烤鸭")
    matching = _holding(ids, "烤鸭")
    assert len(matching) == 2
    assert set(_ids(hybrid)[:2]) == matching
    assert len(hybrid["results"]) == len(GALLERY)  # the CLIP results follow
    spans = {r["id"]: r["matched_text"] for r in hybrid["results"][:2]}
    assert spans[ids["穿红色裙子的女孩"]] == {"text": "烤鸭", "start": 2, "end": 4, "line": "北京烤鸭", "line_start": 0}
    assert spans[ids["草地上的小狗"]]["text"] == "烤鸭"
    assert all(r["matched_text"] is None for r in hybrid["results"][2:])
    # scores stay the cosines of a CLIP search
    cosines = {r["id"]: r["score"] for r in _search(client, "烤鸭", mode="clip")["results"]}
    assert {r["id"]: r["score"] for r in hybrid["results"]} == cosines


def test_a_query_no_text_holds_keeps_the_clip_ranking(app: tuple[TestClient, dict[str, int]]) -> None:
    client, _ = app
    for query in ["海边的日落", "一只猫", "red dress"]:
        hybrid, clip = _search(client, query), _search(client, query, mode="clip")
        assert hybrid["results"] == clip["results"], query
        assert (hybrid["total"], hybrid["total_exact"]) == (clip["total"], clip["total_exact"])


def test_spans_of_latin_digits_and_later_lines(app: tuple[TestClient, dict[str, int]]) -> None:
    client, ids = app
    exit_sign = _search(client, "出口b", mode="text")["results"]
    assert _ids({"results": exit_sign}) == [ids["黄色的出租车"]]
    assert exit_sign[0]["matched_text"] == {"text": "出口 B", "start": 0, "end": 4, "line": "出口 B", "line_start": 0}
    hours = _search(client, "9:00", mode="text")["results"]
    assert hours[0]["matched_text"] == {"text": "9:00", "start": 7, "end": 11, "line": "9:00 开会", "line_start": 7}
    item = client.get(f"/v1/items/{ids['一只黑猫']}").json()
    assert item["ocr_text"] == "会议室 3F\n9:00 开会"
    assert item["ocr_text"][7:11] == "9:00"
    assert client.get(f"/v1/items/{ids['蓝天下的海滩']}").json()["ocr_text"] == ""  # read, none found
    assert client.get(f"/v1/items/{ids['一只黑猫']}").json()["ocr_text"] is not None
    assert client.get(f"/v1/items/{ids['white snowy mountain']}").json()["ocr_text"] is None  # never read


def test_text_mode_ranks_by_coverage_and_cuts_on_it(app: tuple[TestClient, dict[str, int]]) -> None:
    client, ids = app
    found = _search(client, "烤鸭", mode="text")
    assert _ids(found) == [ids["草地上的小狗"], ids["穿红色裙子的女孩"]]  # all of "烤鸭烤鸭", 2 of 7
    assert [r["score"] for r in found["results"]] == pytest.approx([1.0, 2 / 7], abs=1e-6)
    assert (found["total"], found["total_exact"], found["below_cutoff"]) == (2, True, 0)
    cut = _search(client, "烤鸭", mode="text", min_score=0.5)
    assert _ids(cut) == [ids["草地上的小狗"]] and cut["below_cutoff"] == 1
    assert _search(client, "不存在的字", mode="text")["results"] == []


def test_a_quoted_part_is_a_hard_filter(app: tuple[TestClient, dict[str, int]]) -> None:
    client, ids = app
    for mode in ["hybrid", "text"]:
        both = _search(client, '"烤鸭" 女孩', mode=mode)
        assert set(_ids(both)) <= _holding(ids, "烤鸭"), mode
        only = _search(client, "“北京” 「全聚德」", mode=mode)
        assert _ids(only) == [ids["穿红色裙子的女孩"]], mode
        assert only["results"][0]["matched_text"]["text"] == "北京"
        assert _search(client, '"没有这些字"', mode=mode)["results"] == []
    quoted_only = _search(client, '"烤鸭"')
    assert _ids(quoted_only) == _ids(_search(client, "烤鸭", mode="text"))
    # in clip mode quotes are part of the CLIP text, as before
    assert len(_search(client, '"烤鸭"', mode="clip")["results"]) == len(GALLERY)


def test_filters_paging_and_orders_apply_to_the_merged_list(app: tuple[TestClient, dict[str, int]]) -> None:
    client, ids = app
    animals = _search(client, "烤鸭", filters={"tags": ["动物"]})
    tagged = {ids[c] for c, tags, _ in GALLERY if "动物" in tags}
    assert set(_ids(animals)) == tagged
    assert _ids(animals)[0] == ids["草地上的小狗"]
    whole = _ids(_search(client, "烤鸭"))
    pages, offset = [], 0
    while offset is not None:
        page = _search(client, "烤鸭", k=2, offset=offset)
        pages += _ids(page)
        assert page["has_more"] == (page["next_offset"] is not None)
        offset = page["next_offset"]
    assert pages == whole
    newest = _search(client, "烤鸭", sort="added")
    assert _ids(newest) == sorted(whole, reverse=True)  # seeded in order: a later upload has a larger id


def test_exclusions_push_the_clip_list(app: tuple[TestClient, dict[str, int]]) -> None:
    client, ids = app
    plain = _search(client, "海边的日落")
    away = _search(client, "海边的日落", exclude=["人"])
    assert away["results"] == _search(client, "海边的日落", mode="clip", exclude=["人"])["results"]
    assert away["results"] != plain["results"]
    assert set(_ids(_search(client, "烤鸭", exclude=["人"]))[:2]) == _holding(ids, "烤鸭")
    for body in [{"query": "烤鸭", "mode": "text"}, {"query": '"烤鸭"', "mode": "hybrid"}]:
        r = client.post("/v1/search/text", json={**body, "exclude": ["人"]})
        assert r.status_code == 422 and "exclude" in r.text, r.text


def test_quotes_and_spaces_alone_are_refused(app: tuple[TestClient, dict[str, int]]) -> None:
    client, _ = app
    r = client.post("/v1/search/text", json={"query": '"  "', "mode": "text"})
    assert r.status_code == 422, r.text


class RecordingEncoder(FakeEncoder):
    """The fake model, keeping every text it was asked to embed."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    async def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        self.texts += list(texts)
        return await super().embed_texts(texts)


def test_the_model_embeds_only_the_unquoted_words(settings: Settings) -> None:
    encoder = RecordingEncoder()
    catalog = open_test_catalog(settings)
    try:
        with api_client(settings, encoder=encoder, catalog=catalog) as client:
            ids = seed(client)
            catalog.texts.put_texts("photos", {ids[c]: _recognised(t) for c, t in TEXTS.items()})
            encoder.texts.clear()
            _search(client, '"会议室" 开会', mode="hybrid")
            _search(client, '"会议室" 开会', mode="clip")
            _search(client, "烤鸭", mode="text")  # needs no model
            _search(client, '"烤鸭"', mode="hybrid")  # nothing unquoted: ranked by the text
            assert encoder.texts == ["开会", '"会议室" 开会']
    finally:
        catalog.close()
