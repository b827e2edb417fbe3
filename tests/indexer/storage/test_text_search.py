"""The text index's query side (indexer/storage/sql/text_search.py) on SQLite and PostgreSQL: every
substring of a stored text is found (one character, pairs, long runs, Latin and digits mixed in),
nothing else is, the rank is the share of the text the piece covers (each piece's order checked
against a Python count, stored per gram for short pieces, computed in SQL for long ones), several
pieces must all be held, and the vector search's filters leave out the same items. The answers are compared with a
plain Python substring scan of the same texts, so both databases are held to one truth."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from indexer.domain.item_texts import RecognisedText, TextLine
from indexer.domain.records import NewImage, SearchFilters
from indexer.domain.text_grams import normalize_text
from indexer.storage.catalog import SqlCatalog
from tests.support.indexer_helpers import jpeg, open_test_catalog, random_unit

TEXTS = [
    "北京烤鸭\n全聚德",
    "出口 B\n EXIT",
    "营业时间 9:00-21:00",
    "会议室 3F",
    "烤鸭 烤鸭 烤鸭",
    "北京欢迎你",
    "",  # read, nothing found
    "ＡＢＣ超市",  # full-width letters fold to abc
]


def _line(text: str) -> TextLine:
    return TextLine(text, ((0.0, 0.0), (10.0, 0.0), (10.0, 5.0), (0.0, 5.0)), 0.9)


@pytest.fixture
def filled(tmp_path: Path, database_url: str) -> Iterator[tuple[SqlCatalog, list[int]]]:
    catalog = open_test_catalog(tmp_path / "data", database_url)
    catalog.create_collection("photos", "images", "m", 8)
    images = [
        NewImage(data=jpeg(i), tags=["even"] if i % 2 == 0 else [], taken_at=datetime(2020 + i, 1, 1, tzinfo=UTC))
        for i in range(len(TEXTS) + 2)  # two items never read
    ]
    ids = [r.id for r in catalog.add_images("photos", images, random_unit(len(images), 8))]
    texts = {
        item_id: RecognisedText(tuple(_line(t) for t in text.split("\n") if t), "test")
        for item_id, text in zip(ids, TEXTS, strict=False)
    }
    assert catalog.texts.put_texts("photos", texts) == len(TEXTS)
    try:
        yield catalog, ids
    finally:
        catalog.close()


def _truth(ids: list[int], piece: str) -> set[int]:
    return {i for i, text in zip(ids, TEXTS, strict=False) if piece in normalize_text(text)}


def _found(catalog: SqlCatalog, pieces: list[str], filters: SearchFilters | None = None, limit: int = 100) -> list[int]:
    target = catalog.collection("photos")
    return [m.item_id for m in catalog.texts.search_texts(target, pieces, filters, limit).matches]


def test_every_substring_of_every_text_is_found_and_nothing_else(filled: tuple[SqlCatalog, list[int]]) -> None:
    catalog, ids = filled
    pieces = {
        n[s:e] for t in TEXTS for n in [normalize_text(t)] for s in range(len(n)) for e in range(s + 1, len(n) + 1)
    }
    assert len(pieces) == 203  # the check below covers them all
    for piece in sorted(pieces):
        assert set(_found(catalog, [piece])) == _truth(ids, piece), piece
    for absent in ["烤肉", "北京烤鸭全聚德X", "出口c", "9:01", "议会"]:
        assert _found(catalog, [normalize_text(absent)]) == []


def _ranked_truth(ids: list[int], piece: str, pieces_held: tuple[str, ...] = ()) -> list[tuple[int, int, float]]:
    """(item id, occurrences, coverage) of the texts holding `piece` and `pieces_held`, best first,
    by a plain Python count (str.count: without overlap)."""
    found = []
    for item_id, text in zip(ids, TEXTS, strict=False):
        normal = normalize_text(text)
        if piece in normal and all(p in normal for p in pieces_held):
            occurrences = normal.count(piece)
            found.append((item_id, occurrences, occurrences * len(piece) / len(normal)))
    return sorted(found, key=lambda m: (-m[2], -m[1], m[0]))


def test_every_substring_is_ranked_as_a_python_count_ranks_it(filled: tuple[SqlCatalog, list[int]]) -> None:
    catalog, ids = filled
    target = catalog.collection("photos")
    pieces = {
        n[s:e] for t in TEXTS for n in [normalize_text(t)] for s in range(len(n)) for e in range(s + 1, len(n) + 1)
    }
    for piece in sorted(pieces):
        truth = _ranked_truth(ids, piece)
        answer = catalog.texts.search_texts(target, [piece], None, 100)
        got = [(m.item_id, m.occurrences, m.coverage) for m in answer.matches]
        assert [g[:2] for g in got] == [t[:2] for t in truth], piece
        assert [g[2] for g in got] == pytest.approx([t[2] for t in truth]), piece
        # a cut page is the head of the full order, short (one gram) or long (trigrams) alike
        head = catalog.texts.search_texts(target, [piece], None, 1)
        assert [m.item_id for m in head.matches] == [t[0] for t in truth[:1]], piece
        assert head.complete == (len(truth) <= 1)
    # a second piece and a filter keep the rank order of the first piece
    for first, second in [("鸭", "烤"), ("烤", "京"), ("烤鸭", "北京烤鸭")]:
        held = [m.item_id for m in catalog.texts.search_texts(target, [first, second], None, 100).matches]
        assert held == [t[0] for t in _ranked_truth(ids, first, (second,))], (first, second)
    even = [m.item_id for m in catalog.texts.search_texts(target, ["鸭"], SearchFilters(tags=["even"]), 100).matches]
    assert even == [t[0] for t in _ranked_truth(ids, "鸭") if ids.index(t[0]) % 2 == 0]


def test_queries_are_normalised_like_the_texts(filled: tuple[SqlCatalog, list[int]]) -> None:
    catalog, ids = filled
    assert _found(catalog, [normalize_text("出口B")]) == [ids[1]]  # OCR's "出口 B" across the space
    assert _found(catalog, [normalize_text("exit")]) == [ids[1]]  # case-blind
    assert _found(catalog, [normalize_text("ａｂｃ")]) == [ids[7]]  # full width folds
    assert _found(catalog, [normalize_text("9:00")]) == [ids[2]]
    assert _found(catalog, [normalize_text("鸭全")]) == [ids[0]]  # across a line break


def test_the_rank_is_the_share_of_the_text_covered(filled: tuple[SqlCatalog, list[int]]) -> None:
    catalog, ids = filled
    target = catalog.collection("photos")
    matches = catalog.texts.search_texts(target, ["烤鸭"], None, 10).matches
    assert [m.item_id for m in matches] == [ids[4], ids[0]]  # 烤鸭×3 (all of it) before 北京烤鸭全聚德
    assert [m.occurrences for m in matches] == [3, 1]
    assert [m.coverage for m in matches] == pytest.approx([1.0, 2 / 7])
    # `limit` cuts the list and says so
    assert _found(catalog, ["北京"]) == [ids[5], ids[0]]  # 2 of 5 characters before 2 of 7
    cut = catalog.texts.search_texts(target, ["北"], None, 1)
    assert len(cut.matches) == 1 and not cut.complete
    assert catalog.texts.search_texts(target, ["北"], None, 2).complete


def test_several_pieces_must_all_be_held(filled: tuple[SqlCatalog, list[int]]) -> None:
    catalog, ids = filled
    assert _found(catalog, ["北京", "烤鸭"]) == [ids[0]]
    assert _found(catalog, ["烤鸭", "北京"]) == [ids[0]]
    assert _found(catalog, ["北京", "欢迎你"]) == [ids[5]]
    assert _found(catalog, ["北京", "exit"]) == []


def test_filters_are_the_vector_searchs(filled: tuple[SqlCatalog, list[int]]) -> None:
    catalog, ids = filled
    even = SearchFilters(tags=["even"])
    assert set(_found(catalog, ["烤"], even)) == {i for i in _truth(ids, "烤") if ids.index(i) % 2 == 0}
    recent = SearchFilters(taken_from=datetime(2024, 1, 1, tzinfo=UTC))
    assert _found(catalog, ["烤鸭"], recent) == [ids[4]]
    assert _found(catalog, ["烤鸭"], SearchFilters(mime=["image/png"])) == []


def test_deleted_items_leave_the_index(filled: tuple[SqlCatalog, list[int]]) -> None:
    catalog, ids = filled
    catalog.delete([ids[4]], reason="user", remember=False)
    assert _found(catalog, ["烤鸭"]) == [ids[0]]
    assert catalog.texts.texts_for([ids[4]]) == {}
