"""The SQL of near-duplicate groups: perceptual hashes (`items.phash`) and copies (`item_copies`).

Copies: within a collection one sha256 is one item, so a second file with the same bytes is not
stored as an item; `cnclip index` records it here (collection, sha256, path, size, mtime), keyed by
path. A copy row is forgotten when its path becomes an item's (the file now holds other bytes, or the
item moved there), when the item with its bytes is deleted (its rows go in the same transaction), and
by `cnclip index --prune` when the file is gone. Rows are joined to items by sha256 when read, so a
copy whose item went in the same run as it was recorded (an edited original) is never shown, and the
next run of its folder indexes the copy as an item of its own.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from sqlalchemy import ColumnElement, Engine, and_, func, insert, select, update
from sqlalchemy.orm import Session

from indexer.domain.duplicates import FileCopy
from indexer.domain.perceptual import PHASH_VERSION
from indexer.domain.values import chunks
from indexer.storage.sql.copy_rows import forget_copy_paths
from indexer.storage.sql.deletion_rows import bump_version
from indexer.storage.sql.lock_order import writer_slot
from indexer.storage.sql.models import ItemCopyRow, ItemRow, utcnow


def record_copies(engine: Engine, collection_id: int, copies: Sequence[FileCopy]) -> None:
    """Record (or update) copies by path; a path that is an item's is left out."""
    by_path = {copy.path: copy for copy in copies}
    if not by_path:
        return
    with Session(engine) as session:
        items: set[str] = set()
        for part in chunks(sorted(by_path)):
            query = select(ItemRow.path).where(ItemRow.collection_id == collection_id, ItemRow.path.in_(part))
            items.update(session.scalars(query))
        kept = [copy for path, copy in sorted(by_path.items()) if path not in items]
        forget_copy_paths(session, collection_id, [copy.path for copy in kept])
        now = utcnow()
        if kept:
            session.execute(
                insert(ItemCopyRow),
                [
                    {
                        "collection_id": collection_id,
                        "sha256": c.sha256,
                        "path": c.path,
                        "root": c.root,
                        "size": c.size,
                        "mtime": c.mtime,
                        "recorded_at": now,
                    }
                    for c in kept
                ],
            )
        session.commit()


def prune_copies(engine: Engine, collection_id: int) -> int:
    """Forget the copies whose files no longer exist (`cnclip index --prune`); returns how many."""
    with Session(engine) as session:
        paths = session.scalars(select(ItemCopyRow.path).where(ItemCopyRow.collection_id == collection_id)).all()
        gone = [path for path in paths if not os.path.exists(path)]
        forget_copy_paths(session, collection_id, gone)
        session.commit()
    return len(gone)


def copies_by_item(engine: Engine, collection_id: int) -> dict[int, list[FileCopy]]:
    """Item id -> the copies of its bytes (by path), for every item of the collection that has some."""
    query = (
        select(ItemRow.id, ItemCopyRow.sha256, ItemCopyRow.path, ItemCopyRow.root, ItemCopyRow.size, ItemCopyRow.mtime)
        .join(ItemRow, (ItemRow.collection_id == ItemCopyRow.collection_id) & (ItemRow.sha256 == ItemCopyRow.sha256))
        .where(ItemCopyRow.collection_id == collection_id)
        .order_by(ItemRow.id, ItemCopyRow.path)
    )
    found: dict[int, list[FileCopy]] = {}
    with Session(engine) as session:
        for item_id, sha, path, root, size, mtime in session.execute(query):
            found.setdefault(int(item_id), []).append(FileCopy(sha, path, root, size, mtime))
    return found


def set_phashes(engine: Engine, collection_id: int, updates: Sequence[tuple[int, int]]) -> int:
    """Record (item id, perceptual hash of this `PHASH_VERSION`) for items without one; returns the version
    written (the rows are stamped with it, so a cached duplicates answer knows it is stale)."""
    with writer_slot(engine), Session(engine) as session:
        version = bump_version(session, collection_id)
        for item_id, phash in updates:
            session.execute(
                update(ItemRow)
                .where(ItemRow.id == item_id, ItemRow.collection_id == collection_id)
                .values(phash=phash, phash_version=PHASH_VERSION, version=version)
            )
        session.commit()
    return version


def hashed_items(engine: Engine, collection_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, hashes) of the collection's items that have a perceptual hash, by id."""
    query = (
        select(ItemRow.id, ItemRow.phash)
        .where(ItemRow.collection_id == collection_id, ItemRow.phash.is_not(None))
        .order_by(ItemRow.id)
    )
    with Session(engine) as session:
        rows = session.execute(query).all()
    ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    return ids, np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))


def current_hash() -> ColumnElement[bool]:
    """An item has a perceptual hash taken by this `PHASH_VERSION`. Never NULL (its negation selects
    the rest): a NULL version is a hash taken before revision 0009, version 1."""
    return and_(ItemRow.phash.is_not(None), func.coalesce(ItemRow.phash_version, 1) == PHASH_VERSION)


def unhashed_ids(engine: Engine, collection_id: int) -> list[int]:
    """Ids of the collection's items without a perceptual hash of this version, in order: what
    `cnclip duplicates --hash-missing` hashes (again)."""
    query = select(ItemRow.id).where(ItemRow.collection_id == collection_id, ~current_hash()).order_by(ItemRow.id)
    with Session(engine) as session:
        return [int(i) for i in session.scalars(query)]


def unhashed_count(engine: Engine, collection_id: int) -> int:
    """How many items of an image collection have no perceptual hash yet."""
    query = select(func.count()).where(ItemRow.collection_id == collection_id, ItemRow.phash.is_(None))
    with Session(engine) as session:
        return int(session.scalar(query) or 0)


def phashes_of(engine: Engine, ids: Sequence[int]) -> dict[int, int]:
    """id -> perceptual hash, for the ids that have one."""
    found: dict[int, int] = {}
    with Session(engine) as session:
        for part in chunks(list(ids)):
            query = select(ItemRow.id, ItemRow.phash).where(ItemRow.id.in_(part), ItemRow.phash.is_not(None))
            found.update({int(i): int(h) for i, h in session.execute(query) if h is not None})
    return found
