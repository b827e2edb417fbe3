"""The catalog's store of text recognised in photos (issue 32), held as `catalog.texts`: collections
by name over indexer/storage/sql/text_rows.py. The `Texts` port (indexer/service/ports.py) is what the
service and the indexing pipeline see of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from indexer.domain.item_texts import ItemText, RecognisedText
from indexer.domain.records import CollectionState, SearchFilters
from indexer.domain.text_query import TextMatches
from indexer.storage.sql.rows import ItemRows
from indexer.storage.sql.text_rows import TextRows
from indexer.storage.sql.text_search import find_texts


class TextStore:
    """Recognised text by collection name: set a collection's OCR flag, store texts with their
    grams, list the items still to read, read texts back."""

    def __init__(self, rows: ItemRows) -> None:
        self._collections = rows
        self.rows = TextRows(rows.engine)

    def set_ocr(self, collection: str, on: bool) -> None:
        """Recognise text in the collection's images from now on (or stop); kept for later runs."""
        self.rows.set_ocr(self._collections.collection(collection).id, on)

    def put_texts(self, collection: str, texts: Mapping[int, RecognisedText]) -> int:
        """Store these items' texts (replacing any); returns how many items still existed."""
        return self.rows.put(self._collections.collection(collection).id, texts)

    def texts_missing(self, collection: str, after: int, limit: int) -> list[int]:
        """Up to `limit` ids above `after`, ascending, of items of the collection not read yet."""
        return self.rows.missing(self._collections.collection(collection).id, after, limit)

    def text_counts(self, collection: str) -> tuple[int, int]:
        """(items read, items with some text) of the collection."""
        return self.rows.count(self._collections.collection(collection).id)

    def texts_for(self, item_ids: Sequence[int]) -> dict[int, ItemText]:
        """item id -> stored text, for the items of `item_ids` that were read."""
        return self.rows.texts_for(item_ids)

    def search_texts(
        self, target: CollectionState, pieces: Sequence[str], filters: SearchFilters | None, limit: int
    ) -> TextMatches:
        """Items of the resolved collection `target` whose text holds every one of `pieces` (normal form,
        indexer/domain/text_grams.py) and that pass `filters`, best first (indexer/storage/sql/text_search.py)."""
        return find_texts(self.rows.engine, target.id, pieces, filters, limit)
