"""The inserting half of `ItemRows.add` (indexer/storage/sql/rows.py): which rows of a batch are new, their upload
copies, and the bulk INSERTs of items, vectors and tags, all in the caller's transaction."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from indexer.domain.perceptual import PHASH_VERSION
from indexer.domain.records import AddResult, CollectionState
from indexer.domain.values import chunks
from indexer.errors import GenerationMoved
from indexer.storage.media.store import media_writes, store_media
from indexer.storage.sql.bulk_load import copy_new_rows, copy_supported
from indexer.storage.sql.models import DeletedItemRow, ItemRow, ItemTagRow, VectorRow, utcnow

# Every column a bulk insert names (a multi-row INSERT needs the same keys in every row).
_EMPTY_ITEM: dict[str, Any] = dict.fromkeys(
    ("path", "root", "size", "mime", "width", "height", "caption", "mtime", "taken_at", "taken_source", "phash")
)


def known_shas(session: Session, collection_id: int, shas: set[str]) -> dict[str, int]:
    """sha256 -> id of the rows the collection has already among `shas`."""
    known: dict[str, int] = {}
    for part in chunks(sorted(shas)):
        query = select(ItemRow.sha256, ItemRow.id).where(
            ItemRow.collection_id == collection_id, ItemRow.sha256.in_(part)
        )
        known.update(list(session.execute(query)))
    return known


def remembered_shas(session: Session, collection_id: int, shas: list[str]) -> set[str]:
    """Which of `shas` a user deleted from the collection (and did not restore)."""
    found: set[str] = set()
    for part in chunks(shas):
        query = select(DeletedItemRow.sha256).where(
            DeletedItemRow.collection_id == collection_id,
            DeletedItemRow.remembered,
            DeletedItemRow.sha256.in_(part),
        )
        found.update(session.scalars(query))
    return found


class NewRows:
    """One batch of rows for a collection: each is new (inserted), already there (its id), a second
    copy of a new one in the same batch (the first one's id, once it exists), or a bulk-indexed file
    whose bytes a user deleted (not added back)."""

    def __init__(
        self,
        collection: CollectionState,
        version: int,
        active_key: str | None,
        known: dict[str, int],
        deleted: set[str],
        media_dir: Path,
        media_guard: ExitStack,
    ) -> None:
        self.collection = collection
        self.version = version
        self.active_key = active_key  # the active generation's key, read back by the version bump (the lock)
        self.known = known
        self.deleted = deleted  # bytes a user deleted from the collection: a bulk-indexed file stays out
        self.media_dir = media_dir
        self.media_guard = media_guard  # holds the media lock once the first upload copy is written
        self.media_locked = False
        self.results: list[AddResult] = []  # negative ids: -1 - index into `values`, resolved by `insert`
        self.positions: list[int] = []  # row index of each new row (its vector's index)
        self.values: list[dict[str, Any]] = []
        self.first_of_sha: dict[str, int] = {}  # sha -> index in `values` (duplicates within the batch)
        self.now = utcnow()

    def take(self, position: int, row: dict[str, Any]) -> None:
        """Plan row `position`: a result for it, and its values when it is new (an upload's bytes are
        copied under the media folder now, under the media lock)."""
        sha = row["sha256"]
        if sha in self.deleted and row.get("path") is not None:
            self.results.append(AddResult(0, False, deleted_by_user=True))
            return
        if sha in self.known:
            self.results.append(AddResult(self.known[sha], False))
            return
        if sha in self.first_of_sha:
            self.results.append(AddResult(-1 - self.first_of_sha[sha], False))  # resolved once ids exist
            return
        data = row.pop("data", None)
        if self.collection.kind == "images" and row.get("path") is None and data is not None:
            if not self.media_locked:
                self.media_guard.enter_context(media_writes(self.media_dir))
                self.media_locked = True
            store_media(self.media_dir, sha, row["mime"], data)
        self.first_of_sha[sha] = len(self.values)
        values = {**_EMPTY_ITEM, **row, "collection_id": self.collection.id, "version": self.version}
        values["phash_version"] = None if values["phash"] is None else PHASH_VERSION  # a hash is taken by this code
        self.values.append({**values, "created_at": self.now, "updated_at": self.now})
        self.positions.append(position)
        self.results.append(AddResult(-1 - self.first_of_sha[sha], True))

    def new_paths(self) -> list[str]:
        """The paths of the bulk-indexed files this batch inserts."""
        return [v["path"] for v in self.values if v["path"] is not None]

    def insert(self, session: Session, unit: np.ndarray, bulk: bool = False) -> list[AddResult]:
        """Insert the new rows, their vectors (rows of `unit`) and tags; the results with real ids. `bulk`:
        by PostgreSQL COPY where the database has it (indexer/storage/sql/bulk_load.py)."""
        new_ids: list[int] = []
        if self.values:
            # Under the collection's lock (the version bump): a swap that committed since the caller read
            # the collection must not get vectors of the model it replaced (indexer/storage/sql/generations.py).
            if self.active_key != self.collection.vector_key:
                raise GenerationMoved(f"collection {self.collection.name!r} swapped its model generation; embed again")
            if bulk and copy_supported(session):
                new_ids = copy_new_rows(session, self.values, unit, self.positions, self.collection.model)
                return [AddResult(new_ids[-1 - r.id], r.created) if r.id < 0 else r for r in self.results]
            # Core bulk inserts (one multi-row INSERT … RETURNING): the ORM unit of work cost ~3 ms a row.
            insert_items = insert(ItemRow).returning(ItemRow.id, sort_by_parameter_order=True)
            new_ids = [int(i) for i in session.scalars(insert_items, self.values)]
            vectors = [
                {"item_id": item_id, "model": self.collection.model, "vector": unit[position].tobytes()}
                for item_id, position in zip(new_ids, self.positions, strict=True)
            ]
            session.execute(insert(VectorRow), vectors)
            tags = [
                {"item_id": item_id, "tag": tag}
                for item_id, values in zip(new_ids, self.values, strict=True)
                for tag in sorted(set(values["tags"]))
            ]
            if tags:
                session.execute(insert(ItemTagRow), tags)
        return [AddResult(new_ids[-1 - r.id], r.created) if r.id < 0 else r for r in self.results]
