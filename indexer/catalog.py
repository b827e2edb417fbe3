"""The catalog: SQL is the source of truth, FAISS the derived search structure, never disagreeing.

Write protocol (one writer at a time, under `_write_lock`):
  1. SQL transaction commits the rows *and* their vectors;
  2. the in-memory FAISS index is updated;
  3. the FAISS file is saved atomically now and then (`index_save_interval_s`) and on close.
A crash after 1 leaves a FAISS file that lacks or still has some ids; `open_catalog` reconciles
every index with SQL (count, max id, id checksum) and catches it up from the stored vectors.
Ids are never reused, so a stale id can never be mistaken for a new row.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from sqlalchemy import Engine, delete, exists, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from indexer.db import create_db_engine, upgrade
from indexer.media import media_file, media_root, store_media
from indexer.models import CollectionRow, ItemRow, ItemTagRow, VectorRow, utcnow
from indexer.types import (
    AddResult,
    CollectionInfo,
    CollectionKind,
    Hit,
    ItemRecord,
    NewImage,
    NewText,
    SearchFilters,
)
from indexer.vector_index import IndexFileError, SearchTuning, VectorIndex, id_checksum
from retrieval.config import Settings
from retrieval.errors import Conflict, InvalidInput, NotFound
from retrieval.manifest import same_model
from retrieval.preprocess import probe_image

log = logging.getLogger(__name__)

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
IN_CHUNK = 5000  # ids per SQL IN (...) list; SQLite allows 32766 variables


# Every column a bulk insert names (a multi-row INSERT needs the same keys in every row).
_EMPTY_ITEM: dict[str, Any] = dict.fromkeys(("path", "size", "mime", "width", "height", "caption", "mtime"))


@dataclass(frozen=True)
class FileState:
    """What the catalog knows about one bulk-indexed file (for incremental runs)."""

    id: int
    sha256: str
    size: int | None
    mtime: float | None


def open_catalog(settings: Settings) -> SqlCatalog:
    """Migrate the database to the newest schema, open it and reconcile every FAISS index with it."""
    engine = create_db_engine(settings.sqlalchemy_url)
    upgrade(engine)
    tuning = SearchTuning(
        rerank_factor=settings.search_rerank_factor,
        nprobe=settings.index_nprobe,
        ef_search=settings.index_ef_search,
        train_min=settings.index_train_min,
    )
    catalog = SqlCatalog(
        engine,
        settings.data_dir,
        tuning=tuning,
        default_factory=settings.index_factory,
        save_interval_s=settings.index_save_interval_s,
        max_image_bytes=settings.max_image_bytes,
        max_image_pixels=settings.max_image_pixels,
    )
    catalog.reconcile_all()
    return catalog


def _naive_utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def _aware(moment: datetime | None) -> datetime | None:
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


def _unit_vectors(vectors: np.ndarray, count: int, dim: int) -> np.ndarray:
    array = np.asarray(vectors, dtype=np.float32)
    if array.shape != (count, dim):
        raise InvalidInput(f"expected vectors of shape ({count}, {dim}), got {array.shape}")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    if not np.all(np.isfinite(array)) or np.any(norms == 0):
        raise InvalidInput("vectors must be finite and non-zero")
    return np.ascontiguousarray(array / norms, dtype=np.float32)


def _chunks(values: Sequence[Any] | np.ndarray, size: int = IN_CHUNK) -> Iterable[list[Any]]:
    """Slices for IN (...) lists; numpy ints become Python ints for the drivers."""
    for start in range(0, len(values), size):
        yield [v.item() if isinstance(v, np.generic) else v for v in values[start : start + size]]


class SqlCatalog:
    """`indexer.types.Catalog` over SQLAlchemy (SQLite or PostgreSQL) and one FAISS index per collection."""

    def __init__(
        self,
        engine: Engine,
        data_dir: Path,
        *,
        tuning: SearchTuning | None = None,
        default_factory: str = "Flat",
        save_interval_s: float = 30.0,
        max_image_bytes: int = 20 * 1024 * 1024,
        max_image_pixels: int = 50_000_000,
    ) -> None:
        self.engine = engine
        self.data_dir = Path(data_dir)
        self.media_dir = media_root(self.data_dir)
        # One folder per database, so two databases sharing a data dir never share index files.
        url_key = hashlib.sha1(engine.url.render_as_string(hide_password=True).encode()).hexdigest()[:10]
        self.index_dir = self.data_dir / "indexes" / url_key
        self.tuning = tuning or SearchTuning()
        self.default_factory = default_factory
        self.save_interval_s = save_interval_s
        self.max_image_bytes = max_image_bytes
        self.max_image_pixels = max_image_pixels
        self._write_lock = threading.RLock()
        self._indexes: dict[int, VectorIndex] = {}
        self._dirty: dict[int, float] = {}  # collection id -> when it first differed from its file
        self._ids_by_name: dict[str, tuple[int, int]] = {}
        self._closed = False

    # --- collections -------------------------------------------------------------------------
    def create_collection(
        self, name: str, kind: CollectionKind, model: str, dim: int, index: str = "Flat"
    ) -> CollectionInfo:
        """A new empty collection; `Conflict` if the name is taken."""
        if not NAME_PATTERN.match(name):
            raise InvalidInput(
                "collection names are 1-64 letters, digits, '_', '-' or '.', starting with a letter/digit"
            )
        if kind not in ("images", "texts"):
            raise InvalidInput("kind must be 'images' or 'texts'")
        if dim < 1 or not model:
            raise InvalidInput("a collection needs a model id and a positive dim")
        try:
            faiss.index_factory(dim, index, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as exc:
            raise InvalidInput(f"not a usable FAISS factory string for dim {dim}: {index!r}") from exc
        with self._write_lock, Session(self.engine, expire_on_commit=False) as session:
            row = CollectionRow(name=name, kind=kind, model=model, dim=dim, index_factory=index)
            session.add(row)
            try:
                session.commit()
            except IntegrityError as exc:
                raise Conflict(f"collection {name!r} already exists") from exc
            self._indexes[row.id] = VectorIndex(dim, index, model, self.tuning)
            self._save(row.id)
            return self._info(row, 0)

    def ensure_collection(
        self, name: str, kind: CollectionKind, model: str, dim: int, index: str | None = None
    ) -> CollectionInfo:
        """The collection `name`, created if missing; `Conflict` if it holds another kind, model or dim."""
        with self._write_lock:
            try:
                info = self.get_collection(name)
            except NotFound:
                return self.create_collection(name, kind, model, dim, index or self.default_factory)
        if (info.kind, info.dim) != (kind, dim) or not same_model(info.model, model):
            raise Conflict(
                f"collection {name!r} holds {info.kind} embedded with model {info.model!r} (dim {info.dim}); "
                f"this needs {kind} with model {model!r} (dim {dim}). Use another collection name."
            )
        return info

    def delete_collection(self, name: str) -> int:
        """Delete collection `name` with all its items and its FAISS file; returns how many items it held."""
        with self._write_lock:
            collection_id, _ = self._lookup(name)
            removed = self.delete(self._sql_ids(collection_id).tolist())
            with Session(self.engine) as session:
                session.execute(delete(CollectionRow).where(CollectionRow.id == collection_id))
                session.commit()
            self._indexes.pop(collection_id, None)
            self._dirty.pop(collection_id, None)
            self._ids_by_name.pop(name, None)
            self._index_path(collection_id).unlink(missing_ok=True)
            return removed

    def get_collection(self, name: str) -> CollectionInfo:
        with Session(self.engine) as session:
            row = session.scalar(select(CollectionRow).where(CollectionRow.name == name))
            if row is None:
                raise NotFound(f"no collection named {name!r}")
            count = session.scalar(select(func.count()).where(ItemRow.collection_id == row.id)) or 0
            return self._info(row, count)

    def list_collections(self) -> list[CollectionInfo]:
        with Session(self.engine) as session:
            query = select(ItemRow.collection_id, func.count()).group_by(ItemRow.collection_id)
            counts = {collection_id: count for collection_id, count in session.execute(query)}
            rows = session.scalars(select(CollectionRow).order_by(CollectionRow.created_at, CollectionRow.id)).all()
            return [self._info(row, counts.get(row.id, 0)) for row in rows]

    def default_collection(self, kind: CollectionKind) -> CollectionInfo | None:
        """The collection searches use when the request names none: the only one, or the oldest."""
        return next((info for info in self.list_collections() if info.kind == kind), None)

    def _info(self, row: CollectionRow, items: int) -> CollectionInfo:
        index = self._indexes.get(row.id)
        return CollectionInfo(
            id=row.id,
            name=row.name,
            kind=row.kind,  # type: ignore[arg-type]
            model=row.model,
            dim=row.dim,
            index=row.index_factory,
            items=items,
            vectors=index.ntotal if index is not None else 0,
            created_at=_aware(row.created_at),
        )

    def _collection_row(self, session: Session, name: str) -> CollectionRow:
        row = session.scalar(select(CollectionRow).where(CollectionRow.name == name))
        if row is None:
            raise NotFound(f"no collection named {name!r}")
        return row

    # --- writes ----------------------------------------------------------------------------------
    def add_images(
        self,
        collection: str,
        images: Sequence[NewImage],
        vectors: np.ndarray,
        *,
        model: str | None = None,
        replace: Sequence[int | None] | None = None,
    ) -> list[AddResult]:
        """Add images with their vectors; an image whose bytes the collection has already is not added
        again (`created=False`, the existing id). `replace[i]` names a row this image supersedes (a
        changed file), deleted in the same transaction."""
        rows: list[dict[str, Any]] = []
        for image in images:
            sha = image.sha256 or hashlib.sha256(image.data).hexdigest()
            width: int | None
            height: int | None
            if image.mime is None:
                mime, width, height = probe_image(image.data, self.max_image_bytes, self.max_image_pixels)
            else:
                mime, width, height = image.mime, image.width, image.height
            fields: dict[str, Any] = {"path": image.path, "sha256": sha, "size": len(image.data), "mime": mime}
            fields.update(width=width, height=height, caption=image.caption, mtime=image.mtime)
            rows.append({**fields, "tags": list(image.tags), "extra": dict(image.extra), "data": image.data})
        return self._add(collection, "images", rows, vectors, model, replace)

    def add_texts(
        self, collection: str, texts: Sequence[NewText], vectors: np.ndarray, *, model: str | None = None
    ) -> list[AddResult]:
        """Add texts with their vectors; a text the collection has already is not added again."""
        rows = []
        for text in texts:
            if not text.text.strip():
                raise InvalidInput("texts must not be empty")
            sha = hashlib.sha256(text.text.encode("utf-8")).hexdigest()
            rows.append({"sha256": sha, "caption": text.text, "tags": list(text.tags), "extra": dict(text.extra)})
        return self._add(collection, "texts", rows, vectors, model, None)

    def _add(
        self,
        collection: str,
        kind: str,
        rows: list[dict[str, Any]],
        vectors: np.ndarray,
        model: str | None,
        replace: Sequence[int | None] | None,
    ) -> list[AddResult]:
        with self._write_lock, Session(self.engine, expire_on_commit=False) as session:
            coll = self._collection_row(session, collection)
            if coll.kind != kind:
                raise InvalidInput(f"collection {collection!r} holds {coll.kind}, not {kind}")
            if model is not None and model != coll.model:
                raise Conflict(f"collection {collection!r} holds vectors of model {coll.model!r}, not {model!r}")
            unit = _unit_vectors(vectors, len(rows), coll.dim)
            shas = sorted({row["sha256"] for row in rows})
            known: dict[str, int] = {}
            for part in _chunks(shas):
                query = select(ItemRow.sha256, ItemRow.id).where(
                    ItemRow.collection_id == coll.id, ItemRow.sha256.in_(part)
                )
                known.update(list(session.execute(query)))
            replaced = {int(r) for r in (replace or []) if r is not None}
            if replaced:
                # Superseded rows go first so that the unique (collection, sha256) never trips on them.
                session.execute(
                    delete(ItemRow).where(ItemRow.id.in_(sorted(replaced)), ItemRow.collection_id == coll.id)
                )
                known = {sha: i for sha, i in known.items() if i not in replaced}
            results: list[AddResult] = []
            new_positions: list[int] = []
            new_values: list[dict[str, Any]] = []
            first_of_sha: dict[str, int] = {}  # sha -> index in new_values (duplicates within the batch)
            now = utcnow()
            for position, row in enumerate(rows):
                sha = row["sha256"]
                if sha in known:
                    results.append(AddResult(known[sha], False))
                    continue
                if sha in first_of_sha:
                    results.append(AddResult(-1 - first_of_sha[sha], False))  # resolved once ids exist
                    continue
                data = row.pop("data", None)
                if kind == "images" and row["path"] is None and data is not None:
                    store_media(self.media_dir, sha, row["mime"], data)
                first_of_sha[sha] = len(new_values)
                new_values.append(
                    {**_EMPTY_ITEM, **row, "collection_id": coll.id, "created_at": now, "updated_at": now}
                )
                new_positions.append(position)
                results.append(AddResult(-1 - first_of_sha[sha], True))
            new_ids: list[int] = []
            if new_values:
                # Core bulk inserts (one multi-row INSERT … RETURNING): the ORM unit of work cost ~3 ms a row.
                insert_items = insert(ItemRow).returning(ItemRow.id, sort_by_parameter_order=True)
                new_ids = [int(i) for i in session.scalars(insert_items, new_values)]
                session.execute(
                    insert(VectorRow),
                    [
                        {"item_id": item_id, "model": coll.model, "vector": unit[position].tobytes()}
                        for item_id, position in zip(new_ids, new_positions, strict=True)
                    ],
                )
                tags = [
                    {"item_id": item_id, "tag": tag}
                    for item_id, values in zip(new_ids, new_values, strict=True)
                    for tag in sorted(set(values["tags"]))
                ]
                if tags:
                    session.execute(insert(ItemTagRow), tags)
            final = [AddResult(new_ids[-1 - r.id], r.created) if r.id < 0 else r for r in results]
            session.commit()
            index = self._index_for(coll.id)
            index.remove(np.array(sorted(replaced), dtype=np.int64))
            if new_ids:
                index.add(np.array(new_ids, np.int64), unit[new_positions])
            self._changed(coll.id)
            return final

    def update_files(self, collection: str, moves: Sequence[tuple[int, str, int, float]]) -> None:
        """Record (item id, new path, size, mtime) for files renamed or touched without new content."""
        with self._write_lock, Session(self.engine) as session:
            coll = self._collection_row(session, collection)
            for item_id, path, size, mtime in moves:
                session.execute(
                    update(ItemRow)
                    .where(ItemRow.id == item_id, ItemRow.collection_id == coll.id)
                    .values(path=path, size=size, mtime=mtime, updated_at=utcnow())
                )
            session.commit()

    def delete(self, item_ids: Sequence[int]) -> int:
        """Delete items (any collections); returns how many existed. Upload copies go with their last row."""
        with self._write_lock, Session(self.engine) as session:
            found: list[tuple[int, int, str, str | None, str | None]] = []
            for part in _chunks(list(item_ids)):
                query = select(ItemRow.id, ItemRow.collection_id, ItemRow.sha256, ItemRow.path, ItemRow.mime)
                found.extend(session.execute(query.where(ItemRow.id.in_(part))))
            for part in _chunks([row[0] for row in found]):
                session.execute(delete(ItemRow).where(ItemRow.id.in_(part)))
            uploads = {(sha, mime) for _, _, sha, path, mime in found if path is None}
            orphans = [
                (sha, mime)
                for sha, mime in uploads
                if not session.scalar(select(exists().where(ItemRow.sha256 == sha, ItemRow.path.is_(None))))
            ]
            session.commit()
        for collection_id in {row[1] for row in found}:
            ids = np.array([row[0] for row in found if row[1] == collection_id], dtype=np.int64)
            self._index_for(collection_id).remove(ids)
            self._changed(collection_id)
        for sha, mime in orphans:
            media_file(self.media_dir, sha, mime).unlink(missing_ok=True)
        return len(found)

    # --- reads -------------------------------------------------------------------------------------
    def get(self, item_id: int) -> ItemRecord:
        records = self.get_many([item_id])
        if not records:
            raise NotFound(f"no item with id {item_id}")
        return records[0]

    def get_many(self, item_ids: Sequence[int]) -> list[ItemRecord]:
        """Records in the order of `item_ids`; ids that do not exist are left out."""
        found: dict[int, ItemRecord] = {}
        with Session(self.engine) as session:
            for part in _chunks(list(item_ids)):
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
                        sha256=item.sha256,
                        size=item.size,
                        mime=item.mime,
                        width=item.width,
                        height=item.height,
                        mtime=item.mtime,
                        created_at=_aware(item.created_at),
                        updated_at=_aware(item.updated_at),
                    )
        return [found[i] for i in item_ids if i in found]

    def vector(self, item_id: int) -> np.ndarray:
        """The stored vector of an item (for "similar images" by id)."""
        with Session(self.engine) as session:
            blob = session.scalar(select(VectorRow.vector).where(VectorRow.item_id == item_id))
        if blob is None:
            raise NotFound(f"no item with id {item_id}")
        return np.frombuffer(blob, dtype=np.float32).copy()

    def media_path(self, item_id: int) -> Path:
        """The indexed file itself, or the copy of an upload under `data_dir/media`."""
        record = self.get(item_id)
        if record.kind != "images":
            raise NotFound(f"item {item_id} is a text, it has no image")
        path = Path(record.path) if record.path else media_file(self.media_dir, record.sha256 or "", record.mime)
        if not path.is_file():
            raise NotFound(f"the image of item {item_id} is no longer on disk")
        return path

    def file_states(self, collection: str) -> dict[str, FileState]:
        """Path -> state of every bulk-indexed file of the collection (for incremental runs)."""
        with Session(self.engine) as session:
            coll = self._collection_row(session, collection)
            query = select(ItemRow.path, ItemRow.id, ItemRow.sha256, ItemRow.size, ItemRow.mtime).where(
                ItemRow.collection_id == coll.id, ItemRow.path.is_not(None)
            )
            rows = session.execute(query)
            return {str(path): FileState(i, sha, size, mtime) for path, i, sha, size, mtime in rows}

    def content_index(self, collection: str) -> dict[str, tuple[int, str | None]]:
        """sha256 -> (item id, path) of every item of the collection (dedupe and rename detection)."""
        with Session(self.engine) as session:
            coll = self._collection_row(session, collection)
            query = select(ItemRow.sha256, ItemRow.id, ItemRow.path).where(ItemRow.collection_id == coll.id)
            return {sha: (i, path) for sha, i, path in session.execute(query)}

    def index_ids(self, collection: str) -> np.ndarray:
        """The ids in the collection's FAISS index, sorted (tests and stats compare them with SQL)."""
        return np.sort(self._index_for(self.get_collection(collection).id).ids())

    def sql_ids(self, collection: str) -> np.ndarray:
        return self._sql_ids(self.get_collection(collection).id)

    # --- search ------------------------------------------------------------------------------------
    def search(self, collection: str, vector: np.ndarray, k: int, filters: SearchFilters | None = None) -> list[Hit]:
        """The `k` items most similar to `vector` (cosine), restricted by `filters`, best first."""
        collection_id, dim = self._lookup(collection)
        if k < 1:
            raise InvalidInput("k must be at least 1")
        query = _unit_vectors(np.asarray(vector, dtype=np.float32).reshape(1, -1), 1, dim)[0]
        allowed = self._filter_ids(collection_id, filters) if filters and _has_filters(filters) else None
        if allowed is not None and len(allowed) == 0:
            return []
        ids, scores = self._index_for(collection_id).search(query, k, self._fetch_vectors, allowed)
        return [Hit(int(i), float(s)) for i, s in zip(ids, scores, strict=True)]

    def _lookup(self, name: str) -> tuple[int, int]:
        """(id, dim) of a collection, cached: collections are never renamed, and `delete_collection`
        clears the entry of the one it drops."""
        if name not in self._ids_by_name:
            with Session(self.engine) as session:
                row = self._collection_row(session, name)
                self._ids_by_name[name] = (row.id, row.dim)
        return self._ids_by_name[name]

    def _filter_ids(self, collection_id: int, filters: SearchFilters) -> np.ndarray:
        query = select(ItemRow.id).where(ItemRow.collection_id == collection_id)
        if filters.mime:
            query = query.where(ItemRow.mime.in_(filters.mime))
        if filters.date_from:
            query = query.where(ItemRow.created_at >= _naive_utc(filters.date_from))
        if filters.date_to:
            query = query.where(ItemRow.created_at <= _naive_utc(filters.date_to))
        for tag in sorted(set(filters.tags or [])):
            query = query.where(exists().where(ItemTagRow.item_id == ItemRow.id, ItemTagRow.tag == tag))
        with Session(self.engine) as session:
            return np.fromiter(session.scalars(query), dtype=np.int64)

    def _fetch_vectors(self, ids: np.ndarray) -> np.ndarray:
        """Stored vectors of `ids`, in that order (exact re-ranking, rebuilds). A row deleted since
        the FAISS search gets a zero vector; `get_many` leaves it out of the answer anyway."""
        found: dict[int, bytes] = {}
        with Session(self.engine) as session:
            for part in _chunks(ids):
                query = select(VectorRow.item_id, VectorRow.vector).where(VectorRow.item_id.in_(part))
                found.update(list(session.execute(query)))
        dim = len(next(iter(found.values()))) // 4 if found else 0
        matrix = np.zeros((len(ids), dim), dtype=np.float32)
        for row, item_id in enumerate(ids):
            blob = found.get(int(item_id))
            if blob is not None:
                matrix[row] = np.frombuffer(blob, dtype=np.float32)
        return matrix

    # --- FAISS files and reconciliation -------------------------------------------------------
    def _index_path(self, collection_id: int) -> Path:
        return self.index_dir / f"{collection_id}.faiss"

    def _sql_ids(self, collection_id: int) -> np.ndarray:
        with Session(self.engine) as session:
            query = select(ItemRow.id).where(ItemRow.collection_id == collection_id).order_by(ItemRow.id)
            return np.fromiter(session.scalars(query), dtype=np.int64)

    def reconcile_all(self) -> None:
        """Load every collection's index and make it agree with SQL (rebuild or catch up, one log line)."""
        self._remove_stale_temp_files()
        with self._write_lock, Session(self.engine) as session:
            for row in session.scalars(select(CollectionRow)).all():
                self._reconcile(row)

    def _index_for(self, collection_id: int) -> VectorIndex:
        """The collection's index; one created by another process since we opened is loaded now."""
        index = self._indexes.get(collection_id)
        if index is None:
            with self._write_lock, Session(self.engine) as session:
                if collection_id not in self._indexes:
                    row = session.get(CollectionRow, collection_id)
                    if row is None:
                        raise NotFound(f"no collection with id {collection_id}")
                    self._reconcile(row)
            index = self._indexes[collection_id]
        return index

    def _reconcile(self, row: CollectionRow) -> None:
        sql_ids = self._sql_ids(row.id)
        try:
            index = VectorIndex.load(self._index_path(row.id), row.dim, row.index_factory, row.model, self.tuning)
        except IndexFileError as exc:
            index = VectorIndex(row.dim, row.index_factory, row.model, self.tuning).build(sql_ids, self._fetch_vectors)
            self._indexes[row.id] = index
            log.info("collection %s: FAISS index rebuilt from SQL (%s): %d vectors", row.name, exc, len(sql_ids))
            self._save(row.id)
            return
        self._indexes[row.id] = index
        faiss_ids = np.sort(index.ids())
        summary = (len(faiss_ids), int(faiss_ids[-1]) if len(faiss_ids) else 0, id_checksum(faiss_ids))
        expected = (len(sql_ids), int(sql_ids[-1]) if len(sql_ids) else 0, id_checksum(sql_ids))
        if summary == expected and np.array_equal(faiss_ids, sql_ids):
            self._maybe_train(row.id, len(sql_ids))
            return
        missing = np.setdiff1d(sql_ids, faiss_ids)
        stale = np.setdiff1d(faiss_ids, sql_ids)
        index.remove(stale)
        index.add(missing, self._fetch_vectors(missing))
        log.info(
            "collection %s: FAISS index caught up from SQL: %d added, %d removed (count/max id/checksum %s -> %s)",
            row.name, len(missing), len(stale), summary, expected,
        )  # fmt: skip
        self._save(row.id)
        self._maybe_train(row.id, len(sql_ids))

    def _maybe_train(self, collection_id: int, count: int) -> None:
        index = self._indexes[collection_id]
        if not index.wants_training(count):
            return
        started = time.perf_counter()
        fresh = index.build(self._sql_ids(collection_id), self._fetch_vectors)
        index.replace_with(fresh)
        log.info(
            "collection %d: trained %s on %d vectors in %.1f s",
            collection_id,
            index.factory,
            count,
            time.perf_counter() - started,
        )
        self._save(collection_id)

    def _changed(self, collection_id: int) -> None:
        self._dirty.setdefault(collection_id, time.monotonic())
        index = self._indexes[collection_id]
        if index.factory != "Flat" and index.active == "Flat":
            self._maybe_train(collection_id, index.ntotal)
        if time.monotonic() - self._dirty.get(collection_id, time.monotonic()) >= self.save_interval_s:
            self._save(collection_id)

    def _save(self, collection_id: int) -> None:
        self._indexes[collection_id].save(self._index_path(collection_id))
        self._dirty.pop(collection_id, None)

    def flush(self) -> None:
        """Save every index that differs from its file."""
        with self._write_lock:
            for collection_id in list(self._dirty):
                self._save(collection_id)

    def _remove_stale_temp_files(self) -> None:
        for tmp in self.index_dir.glob("*.tmp-*"):
            pid = tmp.name.split(".tmp-")[-1].split("-")[0]
            if pid.isdigit() and not _process_alive(int(pid)):
                tmp.unlink(missing_ok=True)

    def close(self) -> None:
        """Save the indexes and release the database."""
        if self._closed:
            return
        self.flush()
        self.engine.dispose()
        self._closed = True


def _has_filters(filters: SearchFilters) -> bool:
    return bool(filters.tags or filters.mime or filters.date_from or filters.date_to)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
