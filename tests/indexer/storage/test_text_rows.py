"""Recognised text in SQL (indexer/storage/sql/text_rows.py, indexer/storage/texts.py): text, lines and
grams written together, read back, listed when missing, and gone with their item or collection (ON
DELETE CASCADE: SQLite's foreign keys are on); the collection's OCR flag. On SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import func, select

from indexer.domain.item_texts import RecognisedText, TextLine
from indexer.domain.records import NewImage
from indexer.domain.text_grams import grams, normalize_text
from indexer.storage.catalog import SqlCatalog
from indexer.storage.sql.models import ItemTextGramRow, ItemTextRow
from tests.support.indexer_helpers import create_once, jpeg, random_unit

DIM = 8
BOX = ((1.0, 2.0), (30.0, 2.0), (30.0, 12.5), (1.0, 12.5))


def _items(catalog: SqlCatalog, name: str, count: int, seed: int = 0) -> list[int]:
    create_once(catalog, name, "images", "fake", DIM)
    images = [NewImage(data=jpeg(seed + n)) for n in range(count)]
    return [r.id for r in catalog.add_images(name, images, random_unit(count, DIM, seed))]


def _counts(catalog: SqlCatalog) -> tuple[int, int]:
    with catalog.engine.connect() as connection:
        texts = connection.scalar(select(func.count()).select_from(ItemTextRow))
        gram_rows = connection.scalar(select(func.count()).select_from(ItemTextGramRow))
    return int(texts or 0), int(gram_rows or 0)


def _text(*lines: str) -> RecognisedText:
    return RecognisedText(tuple(TextLine(line, BOX, 0.97) for line in lines), engine="test 1")


def test_texts_round_trip_with_their_lines_and_grams(catalog: SqlCatalog) -> None:
    ids = _items(catalog, "photos", 3)
    stored = catalog.texts.put_texts(
        "photos", {ids[0]: _text("北京烤鸭", "出口 B"), ids[1]: RecognisedText(engine="t")}
    )
    assert stored == 2
    found = catalog.texts.texts_for(ids)
    assert set(found) == {ids[0], ids[1]}  # ids[2] was not read
    first = found[ids[0]]
    assert (first.text, first.normalized, first.engine) == ("北京烤鸭\n出口 B", "北京烤鸭出口b", "test 1")
    assert first.lines == (TextLine("北京烤鸭", BOX, 0.97), TextLine("出口 B", BOX, 0.97))
    assert found[ids[1]].text == "" and found[ids[1]].lines == ()  # read, nothing found: done all the same
    assert _counts(catalog) == (2, len(grams(normalize_text("北京烤鸭出口B"))))
    assert catalog.texts.text_counts("photos") == (2, 1)


def test_a_second_put_replaces_text_and_grams(catalog: SqlCatalog) -> None:
    [item] = _items(catalog, "photos", 1)
    catalog.texts.put_texts("photos", {item: _text("禁止吸烟")})
    catalog.texts.put_texts("photos", {item: _text("小心")})
    assert catalog.texts.texts_for([item])[item].text == "小心"
    assert _counts(catalog) == (1, 3)  # 小, 心, 小心


def test_missing_lists_unread_items_in_id_order_after_a_cursor(catalog: SqlCatalog) -> None:
    ids = _items(catalog, "photos", 6)
    _items(catalog, "other", 2, seed=50)  # another collection's items are never listed
    catalog.texts.put_texts("photos", {ids[1]: _text("甲"), ids[4]: RecognisedText()})
    assert catalog.texts.texts_missing("photos", 0, 100) == [ids[0], ids[2], ids[3], ids[5]]
    assert catalog.texts.texts_missing("photos", ids[2], 1) == [ids[3]]
    assert catalog.texts.texts_missing("photos", ids[5], 10) == []


def test_items_of_another_collection_or_deleted_ones_are_skipped(catalog: SqlCatalog) -> None:
    ids = _items(catalog, "photos", 2)
    [foreign] = _items(catalog, "other", 1, seed=9)
    catalog.delete([ids[1]], reason="user", remember=True)
    assert catalog.texts.put_texts("photos", {ids[0]: _text("甲"), ids[1]: _text("乙"), foreign: _text("丙")}) == 1
    assert set(catalog.texts.texts_for([ids[0], ids[1], foreign])) == {ids[0]}


def test_text_goes_with_its_item_and_its_collection(catalog: SqlCatalog) -> None:
    ids = _items(catalog, "photos", 3)
    [kept] = _items(catalog, "other", 1, seed=20)
    catalog.texts.put_texts("photos", {i: _text(f"第{n}张照片") for n, i in enumerate(ids)})
    catalog.texts.put_texts("other", {kept: _text("留下")})
    catalog.delete([ids[0]], reason="user", remember=True)
    assert set(catalog.texts.texts_for(ids)) == {ids[1], ids[2]}
    with catalog.engine.connect() as connection:
        assert connection.scalar(select(func.count()).where(ItemTextGramRow.item_id == ids[0])) == 0
    catalog.delete_collection("photos")
    assert _counts(catalog) == (1, len(grams("留下")))
    assert set(catalog.texts.texts_for([kept])) == {kept}


def test_the_ocr_flag_is_the_collection_s(catalog: SqlCatalog) -> None:
    _items(catalog, "photos", 1)
    assert catalog.collection("photos").ocr is False and catalog.get_collection("photos").ocr is False
    catalog.texts.set_ocr("PHOTOS", True)  # names are case-insensitive
    assert catalog.collection("photos").ocr is True and catalog.get_collection("photos").ocr is True
    catalog.texts.set_ocr("photos", False)
    assert catalog.collection("photos").ocr is False
