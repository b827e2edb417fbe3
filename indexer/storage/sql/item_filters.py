"""The search filters (tags, mime, dates) as SQL conditions on `items`: one rule for the vector
engine's allow-list (indexer/storage/sql/rows.py `filter_ids`) and the text search
(indexer/storage/sql/text_search.py), so both leave out the same items."""

from __future__ import annotations

from sqlalchemy import ColumnElement, exists

from indexer.domain.records import SearchFilters
from indexer.domain.values import naive_utc
from indexer.storage.sql.models import ItemRow, ItemTagRow


def filter_conditions(filters: SearchFilters | None) -> list[ColumnElement[bool]]:
    """WHERE conditions on `ItemRow` that keep the items passing `filters` (none for no filters)."""
    if filters is None:
        return []
    conditions: list[ColumnElement[bool]] = []
    if filters.mime:
        conditions.append(ItemRow.mime.in_(filters.mime))
    if filters.date_from:
        conditions.append(ItemRow.created_at >= naive_utc(filters.date_from))
    if filters.date_to:
        conditions.append(ItemRow.created_at <= naive_utc(filters.date_to))
    if filters.taken_from:
        conditions.append(ItemRow.taken_at >= naive_utc(filters.taken_from))
    if filters.taken_to:
        conditions.append(ItemRow.taken_at <= naive_utc(filters.taken_to))
    for tag in sorted(set(filters.tags or [])):
        conditions.append(exists().where(ItemTagRow.item_id == ItemRow.id, ItemTagRow.tag == tag))
    return conditions
