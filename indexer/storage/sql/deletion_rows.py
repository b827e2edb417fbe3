"""The collection version bump every write starts with; deleting item rows (each deletion logged with
its reason and whether `cnclip index` must remember it, the rows' copies forgotten) in the caller's
transaction after that bump; and which upload copies rows still name, asked on the caller's connection
(indexer/storage/sql/rows.py's rule; indexer/storage/sql/lock_order.py's order)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.orm import Session

from indexer.domain.values import chunks
from indexer.storage.sql.copy_rows import forget_copies_of
from indexer.storage.sql.models import CollectionRow, DeletedItemRow, ItemRow, utcnow


class VersionBump(NamedTuple):
    """What a version bump read back: the version written and the active model generation's key
    (None when the collection is gone)."""

    version: int
    vector_key: str | None


def bump_collection(session: Session, collection_id: int) -> VersionBump:
    """The collection's next version and its active generation's key, in one statement (UPDATE …
    RETURNING): an insert checks that key under this lock without reading the row again. On
    PostgreSQL this row stays locked until commit."""
    bump = (
        update(CollectionRow)
        .where(CollectionRow.id == collection_id)
        .values(version=CollectionRow.version + 1)
        .returning(CollectionRow.version, CollectionRow.vector_key)
    )
    row = session.execute(bump, execution_options={"synchronize_session": False}).first()
    return VersionBump(int(row[0]), str(row[1])) if row is not None else VersionBump(0, None)


def bump_version(session: Session, collection_id: int) -> int:
    """The collection's next version; on PostgreSQL this row stays locked until commit."""
    return bump_collection(session, collection_id).version


def delete_committed(
    session: Session, item_ids: Sequence[int], reason: str, remembered: bool, removed: dict[int, int]
) -> list[tuple[str, str | None]]:
    """`delete`'s transaction, committed; fills `removed`, returns the upload copies of the rows."""
    found: list[tuple[int, int]] = []
    for part in chunks(list(item_ids)):
        found.extend(session.execute(select(ItemRow.id, ItemRow.collection_id).where(ItemRow.id.in_(part))))
    orphans: list[tuple[str, str | None]] = []
    for collection_id in sorted({cid for _, cid in found}):
        ids = sorted(i for i, cid in found if cid == collection_id)
        version = bump_version(session, collection_id)
        orphans += delete_rows(session, collection_id, ids, version, reason, remembered)
        removed[collection_id] = len(ids)
    session.commit()
    return orphans


def delete_rows(
    session: Session, collection_id: int, ids: list[int], version: int, reason: str, remembered: bool
) -> list[tuple[str, str | None]]:
    """Delete `ids` (of one collection) and log each deletion; returns the uploads they had."""
    uploads: list[tuple[str, str | None]] = []
    for part in chunks(ids):
        rows = session.execute(
            select(ItemRow.id, ItemRow.sha256, ItemRow.path, ItemRow.mime).where(
                ItemRow.id.in_(part), ItemRow.collection_id == collection_id
            )
        ).all()
        if not rows:
            continue
        now = utcnow()
        session.execute(
            insert(DeletedItemRow),
            [
                {
                    "collection_id": collection_id,
                    "item_id": item_id,
                    "version": version,
                    "reason": reason,
                    "remembered": remembered,
                    "sha256": sha,
                    "path": path,
                    "deleted_at": now,
                }
                for item_id, sha, path, _ in rows
            ],
        )
        session.execute(delete(ItemRow).where(ItemRow.id.in_([r[0] for r in rows])))
        forget_copies_of(session, collection_id, [sha for _, sha, _, _ in rows])
        uploads += [(sha, mime) for _, sha, path, mime in rows if path is None]
    return uploads


def uploads_in_use_on(connection: Connection, shas: Sequence[str]) -> set[str]:
    """Which of `shas` some upload row (any collection) names, read on `connection` (one the caller
    holds: asked under the media lock, a second pooled connection is never waited for) in a read
    transaction of its own, so that each call sees what committed before it (SQLite keeps a snapshot
    for a whole transaction)."""
    found: set[str] = set()
    with connection.begin():
        for part in chunks(sorted(set(shas))):
            query = select(ItemRow.sha256).where(ItemRow.sha256.in_(part), ItemRow.path.is_(None)).distinct()
            found.update(connection.scalars(query))
    return found
