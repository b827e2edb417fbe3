"""SQL, the source of truth: collections, items, tags, vectors and deletions, and nothing else.

Every write bumps its collection's `version` first, in the same transaction, and stamps the rows it
adds or deletes with the new value. On PostgreSQL the bump takes the collection row's lock until
commit, so writers of one collection commit in version order and a reader that has seen version v
finds every later change with `version > v` (indexer/storage/sync.py relies on this); SQLite has a single
writer anyway. Ids are never reused, so a stale id can never be taken for a new row.

Locks are taken in indexer/storage/sql/lock_order.py's one order: a writer slot, then one pooled connection,
then the collection row lock(s), then the media lock; every write here holds one connection from
its first statement to the end of its clean-up, and never asks the pool for a second one.

A write's answer is the truth: once its transaction commits, nothing after it (removing upload
copies no row names any more) raises; a failed clean-up is logged and retried by the next one
(and by the start-up sweep, indexer/storage/media/sweep.py).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from indexer.domain.names import collection_key
from indexer.domain.records import (
    AddResult,
    CollectionKind,
    CollectionState,
    FileState,
    ItemAttrs,
    ItemRecord,
    SearchFilters,
)
from indexer.domain.values import aware, chunks, vector_matrix
from indexer.storage.media.sweep import remove_unused_copies
from indexer.storage.sql.copy_rows import forget_copy_paths
from indexer.storage.sql.deletion_rows import bump_collection, delete_committed, delete_rows, uploads_in_use_on
from indexer.storage.sql.duplicate_rows import current_hash
from indexer.storage.sql.item_filters import filter_conditions
from indexer.storage.sql.lock_order import writer_slot
from indexer.storage.sql.models import CollectionRow, DeletedItemRow, ItemRow, VectorRow, utcnow
from indexer.storage.sql.row_inserts import NewRows, known_shas, remembered_shas
from retrieval.errors import Conflict, NotFound

log = logging.getLogger(__name__)

PENDING_CLEANUP_MAX = 10_000  # upload copies kept for the next clean-up; beyond, the start-up sweep


def _epoch(naive_utc: datetime | None) -> float | None:
    """A stored timestamp (naive UTC, indexer/storage/sql/models.py) as epoch seconds, comparable with st_ctime."""
    return None if naive_utc is None else naive_utc.replace(tzinfo=UTC).timestamp()


def _state(row: CollectionRow) -> CollectionState:
    return CollectionState(
        id=row.id,
        name=row.name,
        kind=row.kind,  # type: ignore[arg-type]
        model=row.model,
        dim=row.dim,
        index=row.index_factory,
        version=int(row.version or 0),
        vector_key=row.vector_key,
        created_at=aware(row.created_at),
        generation=int(row.generation or 0),
        ocr=bool(row.ocr),
    )


class ItemRows:
    """The catalog's SQL: synchronous, thread-safe (one session per call)."""

    def __init__(self, engine: Engine, media_dir: Any) -> None:
        self.engine = engine
        self.media_dir = media_dir
        self._pending: dict[str, str | None] = {}  # sha256 -> mime of copies a failed clean-up left
        self._pending_lock = threading.Lock()

    def ping(self) -> None:
        """One indexed read that touches the database file or server (not just `SELECT 1`, which a
        SQLite connection answers without reading its file)."""
        with self.engine.connect() as connection:
            connection.execute(select(CollectionRow.id).limit(1)).first()

    # --- collections -----------------------------------------------------------------------
    def create_collection(self, name: str, kind: CollectionKind, model: str, dim: int, factory: str) -> CollectionState:
        with Session(self.engine, expire_on_commit=False) as session:
            row = CollectionRow(
                name=name,
                name_key=collection_key(name),
                kind=kind,
                model=model,
                dim=dim,
                index_factory=factory,
                version=0,
                vector_key=uuid.uuid4().hex,
                created_at=utcnow(),
            )
            session.add(row)
            try:
                session.commit()
            except IntegrityError as exc:
                raise Conflict(f"collection {name!r} already exists (names are case-insensitive)") from exc
            return _state(row)

    def collection(self, name: str) -> CollectionState:
        """The collection named `name`, case-insensitively; `NotFound` otherwise."""
        with Session(self.engine) as session:
            row = session.scalar(select(CollectionRow).where(CollectionRow.name_key == collection_key(name)))
            if row is None:
                raise NotFound(f"no collection named {name!r}")
            return _state(row)

    def version_of(self, name: str) -> tuple[str, int] | None:
        """(vector key, version) of the collection named `name`: the cheap check a search makes."""
        query = select(CollectionRow.vector_key, CollectionRow.version).where(
            CollectionRow.name_key == collection_key(name)
        )
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
        return (row[0], int(row[1])) if row is not None else None

    def collection_by_id(self, collection_id: int) -> CollectionState | None:
        with Session(self.engine) as session:
            row = session.get(CollectionRow, collection_id)
            return _state(row) if row is not None else None

    def collections(self) -> list[CollectionState]:
        """Every collection, oldest first."""
        with Session(self.engine) as session:
            rows = session.scalars(select(CollectionRow).order_by(CollectionRow.created_at, CollectionRow.id)).all()
            return [_state(row) for row in rows]

    def item_counts(self, collection_id: int | None = None) -> dict[int, int]:
        query = select(ItemRow.collection_id, func.count()).group_by(ItemRow.collection_id)
        if collection_id is not None:
            query = query.where(ItemRow.collection_id == collection_id)
        with Session(self.engine) as session:
            return {cid: int(count) for cid, count in session.execute(query)}

    def remembered_count(self, collection_id: int) -> int:
        query = select(func.count()).where(DeletedItemRow.collection_id == collection_id, DeletedItemRow.remembered)
        with Session(self.engine) as session:
            return int(session.scalar(query) or 0)

    def drop_collection(self, collection_id: int) -> None:
        """The collection and all its rows (cascades), upload copies no other row uses."""
        with writer_slot(self.engine), self.engine.connect() as connection:
            with Session(bind=connection) as session:
                uploads = session.execute(
                    select(ItemRow.sha256, ItemRow.mime).where(
                        ItemRow.collection_id == collection_id, ItemRow.path.is_(None)
                    )
                ).all()
                session.execute(delete(CollectionRow).where(CollectionRow.id == collection_id))
                session.commit()
            self.remove_copies(connection, [(sha, mime) for sha, mime in uploads])

    # --- writes ----------------------------------------------------------------------------------
    def add(
        self,
        collection: CollectionState,
        rows: list[dict[str, Any]],
        unit: np.ndarray,
        replace: Sequence[int | None] | None,
        bulk: bool = False,
    ) -> tuple[list[AddResult], int]:
        """Insert new rows with their (L2-normalised) vectors in one transaction; rows whose sha256 the
        collection has already are not added again. `replace[i]` names a row row i supersedes (a changed
        file), deleted in the same transaction. `bulk`: a bulk load (NewRows.insert). Returns the results
        and the version written."""
        # The media lock (taken before the first copy is written, released after the session closes)
        # keeps the start-up sweep of another process from deleting a copy before its row commits.
        with (
            writer_slot(self.engine),
            ExitStack() as media_guard,
            Session(self.engine, expire_on_commit=False) as session,
        ):
            version, active_key = bump_collection(session, collection.id)
            known = known_shas(session, collection.id, {row["sha256"] for row in rows})
            # Read after the version bump, which a user's deletion takes too: a deletion that committed
            # while this batch was being embedded is seen here, so its bytes do not come back.
            deleted = remembered_shas(
                session, collection.id, sorted({row["sha256"] for row in rows if row.get("path") is not None})
            )
            replaced = sorted({int(r) for r in (replace or []) if r is not None})
            if replaced:
                # Superseded rows go first so that the unique (collection, sha256) never trips on them.
                delete_rows(session, collection.id, replaced, version, "replaced", remembered=False)
                known = {sha: i for sha, i in known.items() if i not in replaced}
            batch = NewRows(collection, version, active_key, known, deleted, self.media_dir, media_guard)
            for position, row in enumerate(rows):
                batch.take(position, row)
            results = batch.insert(session, unit, bulk)
            forget_copy_paths(session, collection.id, batch.new_paths())
            session.commit()
            return results, version

    def update_files(self, collection_id: int, moves: Sequence[tuple[int, str, int, float]]) -> None:
        """Record (item id, new path, size, mtime) for files renamed or touched without new content."""
        with writer_slot(self.engine), Session(self.engine) as session:
            for item_id, path, size, mtime in moves:
                session.execute(
                    update(ItemRow)
                    .where(ItemRow.id == item_id, ItemRow.collection_id == collection_id)
                    .values(path=path, size=size, mtime=mtime, updated_at=utcnow())
                )
            forget_copy_paths(session, collection_id, [path for _, path, _, _ in moves])
            session.commit()

    def delete(self, item_ids: Sequence[int], reason: str, remembered: bool) -> dict[int, int]:
        """Delete items of any collections; returns collection id -> how many of its items existed.
        `remembered` deletions keep `cnclip index` from adding the same bytes again."""
        removed: dict[int, int] = {}
        with writer_slot(self.engine), self.engine.connect() as connection:
            with Session(bind=connection) as session:
                orphans = delete_committed(session, item_ids, reason, remembered, removed)
            self.remove_copies(connection, orphans)  # after the commit: never raises
        return removed

    def remove_copies(self, connection: Connection, copies: Sequence[tuple[str, str | None]]) -> None:
        """After a commit: remove the upload copies (sha256, mime) no row names any more, with those a
        failed clean-up left, asking SQL on `connection` (held already: step 2 before step 4 of the lock
        order). Never raises: the rows are gone and the answer says so; a failure is logged and the
        copies are tried again by the next clean-up (an orphan left at exit goes with the start-up sweep)."""
        with self._pending_lock:
            wanted = {**self._pending, **dict(copies)}
            self._pending.clear()
        if not wanted:
            return
        try:
            remove_unused_copies(self.media_dir, list(wanted.items()), lambda shas: uploads_in_use_on(connection, shas))
        except Exception as exc:  # the deletion committed: its answer stands
            log.warning(
                "could not remove %d unused upload copies under %s (%s); retried after the next deletion",
                len(wanted),
                self.media_dir,
                " ".join(str(exc).split()) or type(exc).__name__,
            )
            with self._pending_lock:
                for sha, mime in wanted.items():
                    if len(self._pending) >= PENDING_CLEANUP_MAX:
                        break
                    self._pending.setdefault(sha, mime)

    def uploads_in_use(self, shas: Sequence[str]) -> set[str]:
        """Which of `shas` some upload row (any collection) still names (on a connection of its own: a
        caller that holds the media lock asks `uploads_in_use_on` its own connection instead)."""
        with self.engine.connect() as connection:
            return uploads_in_use_on(connection, shas)

    def remembered_deletions(self, collection_id: int) -> set[str]:
        """sha256 of the items a user deleted from the collection (and did not restore)."""
        query = select(DeletedItemRow.sha256).where(
            DeletedItemRow.collection_id == collection_id, DeletedItemRow.remembered
        )
        with Session(self.engine) as session:
            return set(session.scalars(query))

    def forget_deletions(self, collection_id: int) -> int:
        """`--restore-deleted`: the next index run may add the deleted bytes again."""
        with writer_slot(self.engine), Session(self.engine) as session:
            result = session.execute(
                update(DeletedItemRow)
                .where(DeletedItemRow.collection_id == collection_id, DeletedItemRow.remembered)
                .values(remembered=False)
            )
            session.commit()
            return int(getattr(result, "rowcount", 0) or 0)

    # --- reads -------------------------------------------------------------------------------------
    def get_many(self, item_ids: Sequence[int]) -> list[ItemRecord]:
        """Records in the order of `item_ids`; ids that do not exist are left out."""
        found: dict[int, ItemRecord] = {}
        with Session(self.engine) as session:
            for part in chunks(list(item_ids)):
                query = select(ItemRow, CollectionRow.name, CollectionRow.kind).join(CollectionRow)
                for item, name, kind in session.execute(query.where(ItemRow.id.in_(part))):
                    found[item.id] = ItemRecord(
                        id=item.id,
                        collection=name,
                        kind=kind,  # type: ignore[arg-type]
                        caption=item.caption,
                        tags=list(item.tags or []),
                        extra=dict(item.extra or {}),
                        path=item.path,
                        root=item.root,
                        sha256=item.sha256,
                        size=item.size,
                        mime=item.mime,
                        width=item.width,
                        height=item.height,
                        mtime=item.mtime,
                        created_at=aware(item.created_at),
                        updated_at=aware(item.updated_at),
                        taken_at=aware(item.taken_at),
                        taken_source=item.taken_source,  # type: ignore[arg-type]
                    )
        return [found[i] for i in item_ids if i in found]

    def file_states(self, collection_id: int) -> dict[str, FileState]:
        """Path -> state of every bulk-indexed file of the collection (for incremental runs)."""
        query = select(
            ItemRow.path,
            ItemRow.id,
            ItemRow.sha256,
            ItemRow.size,
            ItemRow.mtime,
            ItemRow.taken_at.is_not(None),
            ItemRow.updated_at,
            current_hash(),
            ItemRow.root,
        ).where(ItemRow.collection_id == collection_id, ItemRow.path.is_not(None))
        with Session(self.engine) as session:
            return {
                str(row[0]): FileState(
                    *row[1:5],
                    has_taken=bool(row[5]),
                    recorded_at=_epoch(row[6]),
                    has_phash=bool(row[7]),
                    root=row[8],
                )
                for row in session.execute(query)
            }

    def content_index(self, collection_id: int) -> dict[str, tuple[int, str | None]]:
        """sha256 -> (item id, path) of every item of the collection (dedupe and rename detection)."""
        query = select(ItemRow.sha256, ItemRow.id, ItemRow.path).where(ItemRow.collection_id == collection_id)
        with Session(self.engine) as session:
            return {sha: (i, path) for sha, i, path in session.execute(query)}

    def ids(self, collection_id: int) -> np.ndarray:
        """The collection's item ids, sorted."""
        query = select(ItemRow.id).where(ItemRow.collection_id == collection_id).order_by(ItemRow.id)
        with Session(self.engine) as session:
            return np.fromiter(session.scalars(query), dtype=np.int64)

    def changes(self, collection_id: int, since: int, until: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids added, ids deleted) by the versions in (since, until]."""
        with Session(self.engine) as session:
            added = session.scalars(
                select(ItemRow.id).where(
                    ItemRow.collection_id == collection_id, ItemRow.version > since, ItemRow.version <= until
                )
            )
            added_ids = np.fromiter(added, dtype=np.int64)
            deleted = session.scalars(
                select(DeletedItemRow.item_id).where(
                    DeletedItemRow.collection_id == collection_id,
                    DeletedItemRow.version > since,
                    DeletedItemRow.version <= until,
                )
            )
            deleted_ids = np.fromiter(deleted, dtype=np.int64)
        return added_ids, deleted_ids

    def vectors(self, ids: np.ndarray | Sequence[int]) -> np.ndarray:
        """Stored vectors of `ids`, in that order. A row deleted meanwhile gets a zero vector;
        callers drop it anyway (its id is no longer in SQL)."""
        found: dict[int, bytes] = {}
        with Session(self.engine) as session:
            for part in chunks(ids):
                query = select(VectorRow.item_id, VectorRow.vector).where(VectorRow.item_id.in_(part))
                found.update(list(session.execute(query)))
        return vector_matrix(ids, found)

    def attrs(self, ids: np.ndarray | Sequence[int]) -> list[ItemAttrs]:
        """The filterable fields of `ids`, in that order (for engines that filter themselves)."""
        found: dict[int, ItemAttrs] = {}
        with Session(self.engine) as session:
            for part in chunks(ids):
                query = select(ItemRow.id, ItemRow.mime, ItemRow.tags, ItemRow.created_at, ItemRow.taken_at)
                for item_id, mime, tags, created, taken in session.execute(query.where(ItemRow.id.in_(part))):
                    found[item_id] = ItemAttrs(mime, tuple(sorted(set(tags or []))), created, taken)
        blank = ItemAttrs(mime=None, tags=(), created_at=datetime(1970, 1, 1))
        return [found.get(int(i), blank) for i in ids]

    def filter_ids(self, collection_id: int, filters: SearchFilters) -> np.ndarray:
        """Ids of the collection's items that pass `filters` (the FAISS engine's allow-list)."""
        query = select(ItemRow.id).where(ItemRow.collection_id == collection_id, *filter_conditions(filters))
        with Session(self.engine) as session:
            return np.fromiter(session.scalars(query), dtype=np.int64)
