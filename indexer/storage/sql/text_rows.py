"""Recognised text in SQL (issue 32): an item's `item_texts` row and its `item_text_grams`, written in
one transaction, so a search never sees a text without its grams (or grams without their text); each
gram row carries the gram's rank in the text (indexer/domain/text_grams.py `gram_ranks`).
Both go with their item by ON DELETE CASCADE (SQLite's foreign keys are on: indexer/storage/sql/db.py),
so deletions, prunes, replaced files and dropped collections need nothing here; a moved item keeps
its id and its text, and model migrations never touch them (text does not depend on the CLIP model).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from sqlalchemy import Engine, delete, exists, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from indexer.domain.item_texts import ItemText, RecognisedText, TextLine
from indexer.domain.text_grams import gram_ranks, normalize_text
from indexer.domain.values import chunks
from indexer.storage.sql.lock_order import writer_slot
from indexer.storage.sql.models import CollectionRow, ItemRow, ItemTextGramRow, ItemTextRow, utcnow


class TextRows:
    """The SQL of recognised text: synchronous, thread-safe (one session per call)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def set_ocr(self, collection_id: int, on: bool) -> None:
        """Turn recognition on or off for the collection's later writes (runs, uploads, watchers)."""
        with writer_slot(self.engine), Session(self.engine) as session:
            session.execute(update(CollectionRow).where(CollectionRow.id == collection_id).values(ocr=on))
            session.commit()

    def put(self, collection_id: int, texts: Mapping[int, RecognisedText]) -> int:
        """Store (or replace) the text of these items of the collection, with their grams; items
        deleted meanwhile, or of another collection, are skipped. Returns how many were stored."""
        if not texts:
            return 0
        try:
            return self._put(collection_id, texts)
        except IntegrityError:
            # An item was deleted between our read of the live ids and our insert (PostgreSQL's
            # foreign key check waits for the deletion, then fails): read them again, once.
            return self._put(collection_id, texts)

    def _put(self, collection_id: int, texts: Mapping[int, RecognisedText]) -> int:
        stored = 0
        with writer_slot(self.engine), Session(self.engine) as session:
            for part in chunks(sorted(texts)):
                alive = set(
                    session.scalars(
                        select(ItemRow.id).where(ItemRow.collection_id == collection_id, ItemRow.id.in_(part))
                    )
                )
                if not alive:
                    continue
                session.execute(delete(ItemTextGramRow).where(ItemTextGramRow.item_id.in_(alive)))
                session.execute(delete(ItemTextRow).where(ItemTextRow.item_id.in_(alive)))
                text_rows: list[dict[str, object]] = []
                gram_rows: list[dict[str, object]] = []
                now = utcnow()
                for item_id in sorted(alive):
                    found = texts[item_id]
                    normalized = normalize_text(found.text)
                    text_rows.append(
                        {
                            "item_id": item_id,
                            "collection_id": collection_id,
                            "text": found.text,
                            "normalized": normalized,
                            "lines": json.dumps([line.as_json() for line in found.lines], ensure_ascii=False),
                            "engine": found.engine[:64],
                            "created_at": now,
                        }
                    )
                    gram_rows.extend(
                        {
                            "collection_id": collection_id,
                            "gram": gram,
                            "item_id": item_id,
                            "occurrences": occurrences,
                            "coverage": share,
                        }
                        for gram, (occurrences, share) in sorted(gram_ranks(normalized).items())
                    )
                session.execute(insert(ItemTextRow), text_rows)
                if gram_rows:
                    session.execute(insert(ItemTextGramRow), gram_rows)
                stored += len(alive)
            session.commit()
        return stored

    def missing(self, collection_id: int, after: int, limit: int) -> list[int]:
        """Ids above `after`, ascending, of the collection's items recognition has not read yet."""
        done = exists().where(ItemTextRow.item_id == ItemRow.id)
        query = (
            select(ItemRow.id)
            .where(ItemRow.collection_id == collection_id, ItemRow.id > after, ~done)
            .order_by(ItemRow.id)
            .limit(limit)
        )
        with self.engine.connect() as connection:
            return [int(i) for i in connection.scalars(query)]

    def count(self, collection_id: int) -> tuple[int, int]:
        """(items read, items with some text) of the collection."""
        with_text = func.count().filter(ItemTextRow.text != "")
        query = select(func.count(), with_text).where(ItemTextRow.collection_id == collection_id)
        with self.engine.connect() as connection:
            read, found = connection.execute(query).one()
        return int(read or 0), int(found or 0)

    def texts_for(self, item_ids: Sequence[int]) -> dict[int, ItemText]:
        """item id -> its stored text, for those of `item_ids` that were read."""
        found: dict[int, ItemText] = {}
        with self.engine.connect() as connection:
            for part in chunks(list(item_ids)):
                for row in connection.execute(select(ItemTextRow).where(ItemTextRow.item_id.in_(part))):
                    lines = tuple(TextLine.from_json(line) for line in json.loads(row.lines or "[]"))
                    found[row.item_id] = ItemText(row.item_id, row.text, row.normalized, lines, row.engine)
        return found
