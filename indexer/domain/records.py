"""Records the catalog hands out and the service passes around (the ports that hand them out:
indexer/service/ports.py).

Plain dataclasses: no SQLAlchemy objects ever leave the indexer package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

CollectionKind = Literal["images", "texts"]
# exif: the photo's DateTimeOriginal; mtime: the file's modification time (no EXIF date);
# upload: the time an uploaded image without an EXIF date was added.
TakenSource = Literal["exif", "mtime", "upload"]
# user: remembered, so `cnclip index` does not add the bytes back; pruned: the file is gone; replaced:
# a changed file's new bytes took its place.
DeleteReason = Literal["user", "pruned", "replaced"]


@dataclass(frozen=True)
class CollectionInfo:
    id: int
    name: str
    kind: CollectionKind
    model: str  # model id the vectors were made with
    dim: int
    index: str  # index description (indexer/domain/index_spec.py), e.g. "Flat" or "IVF1024,PQ64"
    items: int  # rows in SQL
    vectors: int  # vectors in the engine (equal to items once reconciled)
    created_at: datetime | None = None
    degraded: str | None = None  # why its vector store failed (indexer/storage/store_health.py); None when healthy
    ocr: bool = False  # text in its photos is recognised at index time (indexer/bulk/ocr_stage.py)


@dataclass(frozen=True)
class ItemRecord:
    """One image (kind images) or one text (kind texts) of a collection."""

    id: int
    collection: str
    kind: CollectionKind
    caption: str | None = None  # for texts: the text itself
    tags: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    path: str | None = None  # source path of an indexed file; None for uploads
    root: str | None = None  # the folder that was indexed when `path` was found (media checks)
    sha256: str | None = None
    size: int | None = None
    mime: str | None = None
    width: int | None = None
    height: int | None = None
    mtime: float | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    taken_at: datetime | None = None  # when the photo was taken (aware UTC); None for texts
    taken_source: TakenSource | None = None  # where taken_at came from


@dataclass(frozen=True)
class ModelIdentity:
    """The model a process embeds with (its encoder's id and vector size)."""

    model_id: str
    dim: int


@dataclass(frozen=True)
class NewImage:
    """An image to add: bytes (an upload) or a path (a bulk-indexed file), plus metadata."""

    data: bytes
    path: str | None = None
    root: str | None = None
    caption: str | None = None
    tags: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    mtime: float | None = None
    # Filled in by callers that probed the file already (the bulk indexer); otherwise the catalog does.
    mime: str | None = None
    width: int | None = None
    height: int | None = None
    sha256: str | None = None
    taken_at: datetime | None = None  # filled in from EXIF / mtime by the service when None
    taken_source: TakenSource | None = None
    phash: int | None = None  # perceptual hash (indexer/domain/perceptual.py); the service computes it when None
    size: int | None = None  # bytes of the file, for a bulk load without them (None: len(data))


@dataclass(frozen=True)
class NewText:
    text: str
    tags: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AddResult:
    id: int  # 0 when nothing was added or found (deleted_by_user)
    created: bool  # False when an identical item (same sha256 / same text) already existed
    # A bulk-indexed file whose bytes a user deleted from the collection: not added back (the
    # deletion may have committed while the file was being embedded; `--restore-deleted` forgets it).
    deleted_by_user: bool = False


@dataclass(frozen=True)
class SearchFilters:
    tags: list[str] | None = None  # an item must carry every listed tag
    mime: list[str] | None = None  # an item's mime must be one of these
    date_from: datetime | None = None  # created_at >= date_from
    date_to: datetime | None = None  # created_at <= date_to
    taken_from: datetime | None = None  # taken_at >= taken_from (items with no taken_at never pass)
    taken_to: datetime | None = None  # taken_at <= taken_to

    def any(self) -> bool:
        """Whether these filters leave anything out."""
        return bool(self.tags or self.mime or self.date_from or self.date_to or self.taken_from or self.taken_to)


@dataclass(frozen=True)
class ItemAttrs:
    """The fields search filters look at, for engines that filter inside the engine (Milvus); read from
    SQL (indexer/storage/sql/rows.py), handed to the engine (indexer/storage/vectors/base.py)."""

    mime: str | None
    tags: tuple[str, ...]
    created_at: datetime  # naive UTC, like SQL
    taken_at: datetime | None = None  # naive UTC; None: unknown (never passes a taken_from/taken_to filter)


@dataclass(frozen=True)
class Hit:
    id: int
    score: float  # cosine similarity (inner product of L2-normalised vectors)


@dataclass(frozen=True)
class CollectionState:
    """A collection's SQL row: what it is, and the version of its latest change."""

    id: int
    name: str
    kind: CollectionKind
    model: str
    dim: int
    index: str  # index description (indexer/domain/index_spec.py)
    version: int
    vector_key: str
    created_at: datetime | None
    generation: int = 0  # the active model generation's number (indexer/storage/sql/generations.py)
    ocr: bool = False  # text in its photos is recognised at index time (indexer/bulk/ocr_stage.py)


@dataclass(frozen=True)
class FileState:
    """What the catalog knows about one bulk-indexed file (for incremental runs)."""

    id: int
    sha256: str
    size: int | None
    mtime: float | None
    has_taken: bool = True  # False: indexed before taken_at existed (the next run reads its date)
    # When the row last recorded the file (epoch seconds): a file whose inode changed after that
    # (st_ctime, which no user can set back) is read again even with its old size and mtime.
    recorded_at: float | None = None
    has_phash: bool = True  # False: no perceptual hash of this version yet (the next run hashes it)
    root: str | None = None  # the folder it was indexed from (`cnclip index --prune` checks it is there)


Progress = Callable[[int, int], None]  # (vectors added so far, vectors to add)


@dataclass
class FileMoves:
    """One pass's path updates by content (indexer/bulk/moves.py): (item id, path, folder, size, mtime)
    with the file's date as read now, and the items to delete as replaced (their path holds another
    item's bytes, theirs are nowhere)."""

    paths: list[tuple[int, str, str | None, int, float]] = field(default_factory=list)
    dates: dict[int, tuple[datetime, TakenSource]] = field(default_factory=dict)
    replaced: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.paths or self.replaced)
