"""The SQL of moves by content (indexer/bulk/moves.py): one pass's path changes, in one transaction.

A renumbering moves every item at once (IMG_0001 takes IMG_0002's item, which took IMG_0003's…), so
the moves are written together: the items whose bytes are gone and whose path another item takes are
deleted first (reason `replaced`), then every moved row leaves its path (NULL) before any takes its
new one. Nothing in between is ever seen by another transaction, and no moment of the transaction
holds two rows at one path (so a unique (collection, path) key, should one exist, never trips on a
swap or a cycle). Ids, vectors and sha256 stay: only the path, its folder, size, mtime and date
change, and the rows are stamped with the new version so that stores that filter on dates re-read
them (indexer/storage/sync.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import cast

from sqlalchemy import Engine, Table, bindparam, select, update
from sqlalchemy.orm import Session

from indexer.domain.duplicates import FileCopy
from indexer.domain.records import FileMoves, FileState, TakenSource
from indexer.domain.values import chunks, naive_utc
from indexer.storage.sql.copy_rows import forget_copy_paths
from indexer.storage.sql.deletion_rows import bump_version, delete_rows
from indexer.storage.sql.duplicate_rows import current_hash
from indexer.storage.sql.lock_order import writer_slot
from indexer.storage.sql.models import ItemCopyRow, ItemRow, utcnow
from indexer.storage.sql.rows import ItemRows, _epoch


def move_items(rows: ItemRows, collection_id: int, moves: FileMoves) -> int:
    """Apply `moves` in one transaction; returns the version written."""
    # The lock order of indexer/storage/sql/lock_order.py: a writer slot, one connection (kept for the clean-up
    # after the commit), the row lock; the media lock only in the clean-up, on that connection.
    with writer_slot(rows.engine), rows.engine.connect() as connection:
        with Session(bind=connection) as session:
            version, orphans = _move_committed(rows, session, collection_id, moves)
        rows.remove_copies(connection, orphans)  # after the commit: never raises
    return version


def _move_committed(
    rows: ItemRows, session: Session, collection_id: int, moves: FileMoves
) -> tuple[int, list[tuple[str, str | None]]]:
    """`move_items`' transaction, committed: the version written and the upload copies it freed."""
    version = bump_version(session, collection_id)
    orphans: list[tuple[str, str | None]] = []
    if moves.replaced:
        ids = sorted(set(moves.replaced))
        orphans = delete_rows(session, collection_id, ids, version, "replaced", remembered=False)
    mine = (ItemRow.collection_id == collection_id,)
    for part in chunks([item_id for item_id, *_ in moves.paths]):
        session.execute(update(ItemRow).where(ItemRow.id.in_(part), *mine).values(path=None))
    undated = [row for row in moves.paths if row[0] not in moves.dates]
    dated = [row for row in moves.paths if row[0] in moves.dates]
    for statement, rows_of in ((_MOVE, undated), (_MOVE_DATED, dated)):
        params = [_params(row, moves.dates.get(row[0]), collection_id, version) for row in rows_of]
        if params:
            session.execute(statement, params)  # executemany: a batch, not a round trip per row
    forget_copy_paths(session, collection_id, [path for _, path, *_ in moves.paths])
    session.commit()
    return version, orphans


_items = cast(Table, ItemRow.__table__)
_MOVE = (
    update(_items)
    .where(_items.c.id == bindparam("b_id"), _items.c.collection_id == bindparam("b_collection"))
    .values(
        path=bindparam("b_path", type_=_items.c.path.type),
        root=bindparam("b_root", type_=_items.c.root.type),
        size=bindparam("b_size"),
        mtime=bindparam("b_mtime"),
        version=bindparam("b_version"),
        updated_at=bindparam("b_now"),
    )
)
_MOVE_DATED = _MOVE.values(taken_at=bindparam("b_taken"), taken_source=bindparam("b_source"))


def _params(
    row: tuple[int, str, str | None, int, float],
    taken: tuple[datetime, TakenSource] | None,
    collection_id: int,
    version: int,
) -> dict[str, object]:
    item_id, path, root, size, mtime = row
    params: dict[str, object] = {
        "b_id": item_id,
        "b_collection": collection_id,
        "b_path": path,
        "b_root": root,
        "b_size": size,
        "b_mtime": mtime,
        "b_version": version,
        "b_now": utcnow(),
    }
    if taken is not None:
        params.update(b_taken=naive_utc(taken[0]), b_source=taken[1])
    return params


def files_with(engine: Engine, collection_id: int, shas: Sequence[str]) -> dict[str, tuple[str, FileState]]:
    """sha256 -> (path, state) of the collection's bulk-indexed items with these bytes (an indexed
    lookup: a watcher's small pass does not read the whole collection)."""
    found: dict[str, tuple[str, FileState]] = {}
    columns = (ItemRow.path, ItemRow.id, ItemRow.sha256, ItemRow.size, ItemRow.mtime, ItemRow.taken_at.is_not(None))
    with Session(engine) as session:
        for part in chunks(sorted(set(shas))):
            query = select(*columns, ItemRow.updated_at, current_hash()).where(
                ItemRow.collection_id == collection_id, ItemRow.sha256.in_(part), ItemRow.path.is_not(None)
            )
            for path, item_id, sha, size, mtime, dated, updated, hashed in session.execute(query):
                state = FileState(item_id, sha, size, mtime, bool(dated), _epoch(updated), bool(hashed))
                found[sha] = (str(path), state)
    return found


def copies_of(engine: Engine, collection_id: int, shas: Sequence[str]) -> dict[str, list[FileCopy]]:
    """sha256 -> the recorded copies of those bytes (by path): where an item's bytes may still be
    when its own path now holds others."""
    found: dict[str, list[FileCopy]] = {}
    with Session(engine) as session:
        for part in chunks(sorted(set(shas))):
            query = (
                select(ItemCopyRow.sha256, ItemCopyRow.path, ItemCopyRow.root, ItemCopyRow.size, ItemCopyRow.mtime)
                .where(ItemCopyRow.collection_id == collection_id, ItemCopyRow.sha256.in_(part))
                .order_by(ItemCopyRow.path)
            )
            for sha, path, root, size, mtime in session.execute(query):
                found.setdefault(sha, []).append(FileCopy(sha, path, root, size, mtime))
    return found


class CatalogMoves:
    """The `MoveStore` port (indexer/service/ports.py), held by `SqlCatalog` as `moves`: every method takes
    the id of a collection the caller resolved; `after_write(collection id, version)` lets the catalog's
    stores catch up after a commit."""

    def __init__(self, rows: ItemRows, after_write: Callable[[int, int | None], None]) -> None:
        self.rows = rows
        self.after_write = after_write

    def move_files(self, collection_id: int, moves: FileMoves) -> None:
        self.after_write(collection_id, move_items(self.rows, collection_id, moves))

    def copies_of(self, collection_id: int, shas: Sequence[str]) -> dict[str, list[FileCopy]]:
        return copies_of(self.rows.engine, collection_id, shas)

    def files_with(self, collection_id: int, shas: Sequence[str]) -> dict[str, tuple[str, FileState]]:
        return files_with(self.rows.engine, collection_id, shas)
