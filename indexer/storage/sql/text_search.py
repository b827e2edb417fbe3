"""Which items' recognised text holds a piece of text (issue 32), on SQLite and PostgreSQL alike.

Texts and queries are compared in one normal form (indexer/domain/text_grams.py). A piece of up to
three characters is a gram: its postings in `item_text_grams` are the matches (no substring test). A
longer piece is found through its trigrams: the items whose postings hold every one of them (an
index range per trigram, grouped), then verified by a substring test on the normal form (`instr`
on SQLite, `strpos` on PostgreSQL), since trigrams in another order pass the first step. So one
character, a pair or a long run is found the same way on both databases, with the same answer:
plain B-tree lookups and integer arithmetic, no FTS5 or pg_trgm (whose tokenizers skip 1- and
2-character Chinese pieces).

Rank: the share of the item's text the piece covers (occurrences × length / text length), then
occurrences, then the item id (indexer/domain/text_grams.py `coverage`). For a gram it was stored with
the posting when the text was written, and an index on (collection, gram, coverage DESC, occurrences
DESC, item id) hands out a page of the best postings without reading the others: a character most
texts hold (one in 86 % of 20k Zipf-drawn texts) costs the page, not the collection. A longer piece
is ranked in SQL from character counts, the same formula on both databases; it matches few texts.

Several pieces (a query's quoted parts) must all be held; the first one drives the lookup and the
rank, the others are verified by the substring test on the rows it found. The collection's search
filters are the vector search's own (indexer/storage/sql/item_filters.py), tested on each posting as
the rank order reaches it, so a filter that keeps most items still stops after the page.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, Engine, Float, Integer, Select, cast, func, select

from indexer.domain.records import SearchFilters
from indexer.domain.text_grams import MAX_GRAM, grams
from indexer.domain.text_query import TextMatch, TextMatches
from indexer.storage.sql.item_filters import filter_conditions
from indexer.storage.sql.models import ItemRow, ItemTextGramRow, ItemTextRow


def _holds(engine: Engine, piece: str) -> ColumnElement[bool]:
    """`piece` occurs in the normal form: an exact substring test, spelled as each database has it."""
    if engine.dialect.name == "postgresql":
        return func.strpos(ItemTextRow.normalized, piece) > 0
    return func.instr(ItemTextRow.normalized, piece) > 0


def _by_gram(
    collection_id: int, gram: str, others: Sequence[str], conditions: list[ColumnElement[bool]], engine: Engine
) -> Select[int, int, float]:
    """Items whose text holds `gram` (up to MAX_GRAM characters), ranked from its postings: the rank
    index is walked in order and the walk stops after the page. Filters and further pieces join their
    tables and test each posting on the way, so they read as many postings as it takes to fill it."""
    query = select(ItemTextGramRow.item_id, ItemTextGramRow.occurrences, ItemTextGramRow.coverage).where(
        ItemTextGramRow.collection_id == collection_id, ItemTextGramRow.gram == gram
    )
    if conditions:
        query = query.join(ItemRow, ItemRow.id == ItemTextGramRow.item_id).where(*conditions)
    if others:
        query = query.join(ItemTextRow, ItemTextRow.item_id == ItemTextGramRow.item_id).where(
            *(_holds(engine, other) for other in others)
        )
    return query.order_by(ItemTextGramRow.coverage.desc(), ItemTextGramRow.occurrences.desc(), ItemTextGramRow.item_id)


def _by_trigrams(
    collection_id: int, piece: str, others: Sequence[str], conditions: list[ColumnElement[bool]], engine: Engine
) -> Select[int, int, float]:
    """Items whose text holds `piece` (longer than MAX_GRAM): those whose postings hold every one of its
    trigrams, verified by the substring test and ranked in SQL by indexer/domain/text_grams.py
    `coverage`, written out for each database (a long piece matches few texts)."""
    trigrams = sorted(g for g in grams(piece) if len(g) == MAX_GRAM)
    candidates = (
        select(ItemTextGramRow.item_id)
        .where(ItemTextGramRow.collection_id == collection_id, ItemTextGramRow.gram.in_(trigrams))
        .group_by(ItemTextGramRow.item_id)
        .having(func.count() == len(trigrams))
    )
    length = func.length(ItemTextRow.normalized)
    occurrences = cast((length - func.length(func.replace(ItemTextRow.normalized, piece, ""))) / len(piece), Integer)
    share = cast(occurrences * len(piece), Float(asdecimal=False)) / cast(length, Float(asdecimal=False))
    query = (
        select(ItemTextRow.item_id, occurrences, share)
        .where(
            ItemTextRow.item_id.in_(candidates),
            ItemTextRow.collection_id == collection_id,
            *(_holds(engine, p) for p in (piece, *others)),
        )
        .order_by(share.desc(), occurrences.desc(), ItemTextRow.item_id)
    )
    if conditions:
        query = query.join(ItemRow, ItemRow.id == ItemTextRow.item_id).where(*conditions)
    return query


def find_texts(
    engine: Engine,
    collection_id: int,
    pieces: Sequence[str],
    filters: SearchFilters | None,
    limit: int,
) -> TextMatches:
    """Items of the collection whose text holds every one of `pieces` (normal form, non-empty) and that
    pass `filters`, ranked by the first piece (see the module docstring), at most `limit` of them."""
    if not pieces or any(not p for p in pieces):
        raise ValueError("every piece must be a non-empty normal-form text")
    ranked, *others = pieces
    find = _by_gram if len(ranked) <= MAX_GRAM else _by_trigrams
    query = find(collection_id, ranked, others, filter_conditions(filters), engine).limit(limit + 1)
    with engine.connect() as connection:
        rows = connection.execute(query).all()
    found = [TextMatch(int(i), int(n), min(1.0, float(c))) for i, n, c in rows[:limit]]
    return TextMatches(found, complete=len(rows) <= limit)
