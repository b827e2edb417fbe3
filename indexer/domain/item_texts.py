"""Records of text recognised in photos (issue 32): what the OCR engine reads (retrieval/ocr/types.py,
re-exported here) and what SQL keeps of it (indexer/storage/sql/text_rows.py)."""

from __future__ import annotations

from dataclasses import dataclass

from retrieval.ocr.types import Point, RecognisedText, TextLine

__all__ = ["ItemText", "Point", "RecognisedText", "TextLine"]


@dataclass(frozen=True)
class ItemText:
    """An item's stored recognised text (an item_texts row); an empty `text`: read, nothing found."""

    item_id: int
    text: str
    normalized: str
    lines: tuple[TextLine, ...] = ()
    engine: str = ""
