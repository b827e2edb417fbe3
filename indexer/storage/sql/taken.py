"""When a photo was taken, kept in SQL (`items.taken_at`, `items.taken_source`); read from its EXIF by
indexer/domain/taken.py. Stored as naive UTC, like every timestamp in SQL.

Catalogs made before revision 0003 have NULL for files: `cnclip index` fills them in (`set_taken`)
without embedding anything again.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from indexer.domain.records import TakenSource
from indexer.domain.values import chunks, naive_utc
from indexer.storage.sql.deletion_rows import bump_version
from indexer.storage.sql.lock_order import writer_slot
from indexer.storage.sql.models import CollectionRow, ItemRow


def set_taken(engine: Engine, collection_id: int, updates: Sequence[tuple[int, datetime, TakenSource]]) -> int:
    """Record (item id, taken_at, source) for items of a collection (the backfill); returns the
    collection version written. The rows are stamped with it, so that other processes re-read their
    attributes (a Milvus store filters on taken_at itself)."""
    with writer_slot(engine), Session(engine) as session:
        version = bump_version(session, collection_id)
        for item_id, moment, source in updates:
            session.execute(
                update(ItemRow)
                .where(ItemRow.id == item_id, ItemRow.collection_id == collection_id)
                .values(taken_at=naive_utc(moment), taken_source=source, version=version)
            )
        session.commit()
    return version


def sort_keys(engine: Engine, ids: Sequence[int]) -> dict[int, tuple[datetime | None, datetime | None]]:
    """id -> (taken_at, created_at), naive UTC, for ordering search results by date."""
    found: dict[int, tuple[datetime | None, datetime | None]] = {}
    with Session(engine) as session:
        for part in chunks(list(ids)):
            query = select(ItemRow.id, ItemRow.taken_at, ItemRow.created_at).where(ItemRow.id.in_(part))
            found.update({i: (taken, created) for i, taken, created in session.execute(query)})
    return found


def missing_count(engine: Engine, collection_name_key: str) -> int:
    """How many folder files of a collection have no taken_at yet (tests, stats)."""
    query = (
        select(ItemRow.id)
        .join(CollectionRow)
        .where(CollectionRow.name_key == collection_name_key, ItemRow.path.is_not(None), ItemRow.taken_at.is_(None))
    )
    with Session(engine) as session:
        return len(session.scalars(query).all())
