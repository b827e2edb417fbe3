"""SQLAlchemy 2 models: the SQL source of truth. FAISS indexes are derived from these rows.

One `items` table holds images and texts alike, because item ids are global: they are the FAISS
ids, `Catalog.get(item_id)` must be unambiguous, and dedupe, delete and reconcile are the same
code for both kinds. A text item keeps its text in `caption` and the sha256 of its UTF-8 bytes.
Vectors live in their own table (float32 bytes + the model that made them) so metadata queries
and filters scan narrow rows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from indexer.fs.file_names import from_sql, to_sql

# SQLite only gives AUTOINCREMENT (ids never reused) to INTEGER PRIMARY KEY; ids must never be
# reused, or a stale FAISS vector could be taken for a new row after a crash.
ItemId = BigInteger().with_variant(Integer(), "sqlite")


class FilePath(TypeDecorator[str]):
    """A file path in a TEXT column: undecodable bytes of a name round-trip (indexer/fs/file_names.py),
    for every query that names the column (inserts, updates, filters and results alike)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else to_sql(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else from_sql(value)


def utcnow() -> datetime:
    """Naive UTC: both backends store timestamps without a zone, by this convention."""
    return datetime.now(UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class CollectionRow(Base):
    __tablename__ = "collections"
    # AUTOINCREMENT: a collection made after another was deleted never takes its id (nor its FAISS file).
    __table_args__ = (UniqueConstraint("name_key", name="uq_collections_name_key"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    # `collection_key(name)`: names are unique case-insensitively (`demo` and `DEMO` cannot coexist).
    name_key: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))  # images | texts
    model: Mapped[str] = mapped_column(String(200))  # model id every vector of the collection was made with
    dim: Mapped[int] = mapped_column(Integer)
    index_factory: Mapped[str] = mapped_column(String(200), default="Flat")
    created_at: Mapped[datetime] = mapped_column(DateTime(), default=utcnow)
    # Bumped in the same transaction as every add or delete: other processes compare it with the
    # version their vector store has caught up to (see indexer/storage/sync.py).
    version: Mapped[int] = mapped_column(BigInteger, default=0)
    # Names the collection's data in a shared vector engine (Milvus), independent of its SQL id.
    vector_key: Mapped[str] = mapped_column(String(32))
    # The active model generation's number (0: the first); others live in `generations` (indexer/storage/sql/generations.py).
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Text in photos is recognised at index time (issue 32; indexer/bulk/ocr_stage.py); kept for later runs.
    ocr: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class ItemRow(Base):
    __tablename__ = "items"
    __table_args__ = (
        UniqueConstraint("collection_id", "sha256", name="uq_items_collection_sha256"),
        Index("ix_items_collection_path", "collection_id", "path"),
        Index("ix_items_collection_created", "collection_id", "created_at"),
        Index("ix_items_collection_version", "collection_id", "version"),
        Index("ix_items_collection_taken", "collection_id", "taken_at"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(ItemId, primary_key=True, autoincrement=True)
    collection_id: Mapped[int] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"))
    path: Mapped[str | None] = mapped_column(FilePath)  # source file of a bulk-indexed image
    root: Mapped[str | None] = mapped_column(FilePath)  # the indexed folder `path` was found under
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int | None] = mapped_column(BigInteger)
    mime: Mapped[str | None] = mapped_column(String(64))
    width: Mapped[int | None] = mapped_column(Integer)
    height: Mapped[int | None] = mapped_column(Integer)
    caption: Mapped[str | None] = mapped_column(Text)
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    extra: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    mtime: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(), default=utcnow, onupdate=utcnow)
    version: Mapped[int] = mapped_column(
        BigInteger, default=0, server_default="0"
    )  # the collection version that added it
    # When the photo was taken (naive UTC) and where that came from: exif | mtime | upload (indexer/storage/sql/taken.py).
    # NULL for texts, and for files indexed before revision 0003 until `cnclip index` reads them again.
    taken_at: Mapped[datetime | None] = mapped_column(DateTime())
    taken_source: Mapped[str | None] = mapped_column(String(8))
    # 64-bit perceptual hash (indexer/domain/perceptual.py), signed. NULL for texts, and for images indexed
    # before revision 0004 until `cnclip index` reads them again.
    phash: Mapped[int | None] = mapped_column(BigInteger)
    # The `PHASH_VERSION` that took it; NULL beside a hash taken before revision 0009 (version 1).
    phash_version: Mapped[int | None] = mapped_column(SmallInteger)


class DeletedItemRow(Base):
    """Every deleted item, with the collection version of its deletion: other processes remove it
    from their vector stores by reading these rows; `remembered` ones (a user's deletion) also keep
    `cnclip index` from bringing the same bytes back."""

    __tablename__ = "deleted_items"
    __table_args__ = (
        Index("ix_deleted_items_collection_version", "collection_id", "version"),
        Index("ix_deleted_items_collection_sha256", "collection_id", "sha256"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(ItemId, primary_key=True, autoincrement=True)
    collection_id: Mapped[int] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"))
    item_id: Mapped[int] = mapped_column(BigInteger)
    version: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(String(16))  # user | pruned | replaced
    remembered: Mapped[bool] = mapped_column(Boolean, default=False)
    sha256: Mapped[str] = mapped_column(String(64))
    path: Mapped[str | None] = mapped_column(FilePath)
    deleted_at: Mapped[datetime] = mapped_column(DateTime(), default=utcnow)


class ItemTagRow(Base):
    """One row per (item, tag): tag filters are a SQL query, not a scan of JSON."""

    __tablename__ = "item_tags"
    __table_args__ = (Index("ix_item_tags_tag", "tag"),)

    item_id: Mapped[int] = mapped_column(ItemId, ForeignKey("items.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(200), primary_key=True)


class VectorRow(Base):
    """The durable copy of an item's vector: FAISS is rebuilt or caught up from these rows."""

    __tablename__ = "vectors"

    item_id: Mapped[int] = mapped_column(ItemId, ForeignKey("items.id", ondelete="CASCADE"), primary_key=True)
    model: Mapped[str] = mapped_column(String(200))
    vector: Mapped[bytes] = mapped_column(LargeBinary)  # float32, little-endian, L2-normalised


class ItemCopyRow(Base):
    """Another file with the bytes of an item of the same collection (one sha256 is one item): the
    identical-bytes tier of `cnclip duplicates`. Written by `cnclip index` when it meets known bytes at
    a second path that exists; forgotten when that path becomes an item, when the item is deleted,
    and by `--prune` when the file is gone (indexer/copies.py)."""

    __tablename__ = "item_copies"
    __table_args__ = (
        UniqueConstraint("collection_id", "path", name="uq_item_copies_collection_path"),
        Index("ix_item_copies_collection_sha256", "collection_id", "sha256"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(ItemId, primary_key=True, autoincrement=True)
    collection_id: Mapped[int] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"))
    sha256: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(FilePath)
    root: Mapped[str | None] = mapped_column(FilePath)
    size: Mapped[int | None] = mapped_column(BigInteger)
    mtime: Mapped[float | None] = mapped_column(Float)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(), default=utcnow)


class GenerationRow(Base):
    """A collection's generation other than the active one (whose model, dim and vector_key are the
    collection's): the `shadow` being filled with the next model, or the `previous` one kept for a
    rollback. At most one of each per collection (indexer/storage/sql/generations.py)."""

    __tablename__ = "generations"
    __table_args__ = (
        UniqueConstraint("collection_id", "role", name="uq_generations_collection_role"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    collection_id: Mapped[int] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(16))  # shadow | previous (swapping: inside the swap's transaction)
    number: Mapped[int] = mapped_column(Integer)  # names its FAISS file; never reused within the collection
    model: Mapped[str] = mapped_column(String(200))
    dim: Mapped[int] = mapped_column(Integer)
    vector_key: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime(), default=utcnow)
    swapped_at: Mapped[datetime | None] = mapped_column(DateTime())  # when it stopped being the active one


class GenerationVectorRow(Base):
    """An item's vector in a generation other than the active one (the active ones are `vectors`)."""

    __tablename__ = "generation_vectors"
    __table_args__ = (Index("ix_generation_vectors_item", "item_id"),)

    generation_id: Mapped[int] = mapped_column(ForeignKey("generations.id", ondelete="CASCADE"), primary_key=True)
    item_id: Mapped[int] = mapped_column(ItemId, ForeignKey("items.id", ondelete="CASCADE"), primary_key=True)
    model: Mapped[str] = mapped_column(String(200))
    vector: Mapped[bytes] = mapped_column(LargeBinary)


class ModelSourceRow(Base):
    """Where a model a migration embedded with was loaded from (`cnclip migrate --model DIR`), by model
    id (its name and the fingerprint of its files): a server that meets a swap to a model it does not
    hold loads it from there, after checking that the directory still holds that very model
    (indexer/service/model_loader.py)."""

    __tablename__ = "model_sources"

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    directory: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(), default=utcnow)


class DuplicateCalibrationRow(Base):
    """The similar-shots threshold measured on a collection with its model (indexer/service/duplicate_calibration.py):
    one row per collection, recomputed when the collection's model or generation changes or it grew or
    shrank a lot. `threshold` is NULL when the model cannot tell a shot from another photo there (the
    similar tier is then off); `details` is the measurement as JSON."""

    __tablename__ = "duplicate_calibrations"

    collection_id: Mapped[int] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"), primary_key=True)
    model: Mapped[str] = mapped_column(String(200))
    generation: Mapped[int] = mapped_column(Integer)
    item_count: Mapped[int] = mapped_column(Integer)
    threshold: Mapped[float | None] = mapped_column(Float)
    details: Mapped[str] = mapped_column(Text)
    computed_at: Mapped[datetime] = mapped_column(DateTime(), default=utcnow)


class ItemTextRow(Base):
    """The text recognised in an image item (issue 32): `text` as read, lines joined by "\\n";
    `normalized` its search form (indexer/domain/text_grams.py); `lines` JSON, a list of
    {"text", "box": [[x, y] × 4], "score"}. An empty `text` means recognised, nothing found."""

    __tablename__ = "item_texts"
    __table_args__ = (Index("ix_item_texts_collection_item", "collection_id", "item_id"),)

    item_id: Mapped[int] = mapped_column(ItemId, ForeignKey("items.id", ondelete="CASCADE"), primary_key=True)
    collection_id: Mapped[int] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"))
    text: Mapped[str] = mapped_column(Text)
    normalized: Mapped[str] = mapped_column(Text)
    lines: Mapped[str] = mapped_column(Text)
    engine: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(), default=utcnow)


class ItemTextGramRow(Base):
    """One row per 1-, 2- or 3-character substring of an item's normalized text: a query of any
    length is found by index lookups (indexer/storage/sql/text_search.py). `occurrences` (how often
    the gram occurs, without overlap) and `coverage` (occurrences × gram length / text length) are the
    rank of a query that is this gram, so the ranking index answers it from the postings alone."""

    __tablename__ = "item_text_grams"
    __table_args__ = (Index("ix_item_text_grams_item", "item_id"),)

    collection_id: Mapped[int] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"), primary_key=True)
    gram: Mapped[str] = mapped_column(String(16), primary_key=True)
    item_id: Mapped[int] = mapped_column(ItemId, ForeignKey("items.id", ondelete="CASCADE"), primary_key=True)
    occurrences: Mapped[int] = mapped_column(Integer)
    coverage: Mapped[float] = mapped_column(Float)


# A query of one gram walks its postings in rank order and stops after the page (text_search.py).
Index(
    "ix_item_text_grams_rank",
    ItemTextGramRow.collection_id,
    ItemTextGramRow.gram,
    ItemTextGramRow.coverage.desc(),
    ItemTextGramRow.occurrences.desc(),
    ItemTextGramRow.item_id,
)
