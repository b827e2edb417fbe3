"""Records the catalog hands out, and the `Catalog` interface the collection service codes against.

Plain dataclasses: no SQLAlchemy objects ever leave the indexer package.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

if TYPE_CHECKING:  # the near-duplicate records (their modules import these types)
    from indexer.bulk.moves import FileMoves
    from indexer.domain.duplicate_pages import TierChoice
    from indexer.service.duplicate_calibration import Calibration
    from indexer.service.duplicates import DuplicatesPage
    from indexer.storage.sql.duplicate_rows import FileCopy
    from indexer.storage.sql.generations import Generation, MigrationStatus

CollectionKind = Literal["images", "texts"]
# exif: the photo's DateTimeOriginal; mtime: the file's modification time (no EXIF date);
# upload: the time an uploaded image without an EXIF date was added.
TakenSource = Literal["exif", "mtime", "upload"]


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
    has_phash: bool = True  # False: indexed before perceptual hashes existed (the next run hashes it)
    root: str | None = None  # the folder it was indexed from (`cnclip index --prune` checks it is there)


Progress = Callable[[int, int], None]  # (vectors added so far, vectors to add)


class Catalog(Protocol):
    """What the collection service (indexer/service/collections.py) needs of storage: SQL + a vector engine
    behind one interface (indexer/storage/catalog.py `SqlCatalog`). Synchronous and thread-safe: the API
    calls it from worker threads (never on the event loop). One writer at a time; searches run
    concurrently with writes. Unknown collections or items raise `retrieval.errors.NotFound`.
    It stores what it is given: the rules are the service's."""

    # --- collections: SQL only, never a vector store -------------------------------------------
    def create_collection(
        self, name: str, kind: CollectionKind, model: str, dim: int, index: str = "Flat"
    ) -> CollectionInfo: ...

    def collection(self, name: str) -> CollectionState: ...

    def collections(self) -> list[CollectionState]:
        """Every collection, oldest first."""

    def get_collection(self, name: str) -> CollectionInfo: ...

    def list_collections(self) -> list[CollectionInfo]: ...

    def delete_collection(self, name: str) -> int: ...

    def remembered_count(self, collection: str) -> int: ...

    def remembered_deletions(self, collection: str) -> set[str]: ...

    def forget_deletions(self, collection: str) -> int: ...

    # --- writes ----------------------------------------------------------------------------------
    def add_images(
        self,
        collection: str,
        images: Sequence[NewImage],
        vectors: np.ndarray,
        *,
        replace: Sequence[int | None] | None = None,
        vector_key: str | None = None,
    ) -> list[AddResult]: ...

    def add_texts(
        self, collection: str, texts: Sequence[NewText], vectors: np.ndarray, *, vector_key: str | None = None
    ) -> list[AddResult]: ...

    def update_files(self, collection: str, moves: Sequence[tuple[int, str, int, float]]) -> None: ...

    def set_taken(self, collection: str, updates: Sequence[tuple[int, datetime, TakenSource]]) -> None: ...

    def delete(self, item_ids: Sequence[int], *, reason: str, remember: bool) -> int: ...

    # --- reads -----------------------------------------------------------------------------------
    def get(self, item_id: int) -> ItemRecord: ...

    def get_many(self, item_ids: Sequence[int]) -> list[ItemRecord]:
        """Records in the order of `item_ids`; ids that do not exist are left out."""

    def vector(self, item_id: int) -> np.ndarray:
        """The stored vector of an item (for "similar images" by id)."""

    def vectors_for(self, collection: str, ids: Sequence[int], vector_key: str) -> np.ndarray:
        """Stored vectors of `ids` of the collection's generation `vector_key` (active or previous)."""

    def read_media(self, item: ItemRecord) -> bytes:
        """The item's image bytes, exactly as indexed (`indexer.storage.media.check`); `NotFound` / `MediaChanged`."""

    def check_media(self, item: ItemRecord) -> None: ...

    def file_states(self, collection: str) -> dict[str, FileState]: ...

    def content_index(self, collection: str) -> dict[str, tuple[int, str | None]]: ...

    def sort_keys(self, item_ids: Sequence[int]) -> dict[int, tuple[datetime | None, datetime | None]]: ...

    # --- near-duplicates (indexer/storage/catalog_duplicates.py) ------------------------------------------------
    def find_duplicates(
        self,
        name: str,
        tier: TierChoice,
        offset: int,
        limit: int,
        *,
        budget_s: float | None,
        threshold: float | None,
        setting_threshold: float | None,
    ) -> DuplicatesPage: ...

    def unhashed_ids(self, name: str) -> list[int]: ...

    def duplicate_calibration(self, name: str) -> tuple[Calibration | None, str | None]: ...

    def calibration_sample(self, name: str) -> list[ItemRecord]: ...

    def finish_calibration(self, name: str, measured: Sequence[tuple[int, np.ndarray]]) -> Calibration: ...

    def set_phashes(self, name: str, updates: Sequence[tuple[int, int]]) -> None: ...

    def record_copies(self, name: str, copies: Sequence[FileCopy]) -> None: ...

    def prune_copies(self, name: str) -> int: ...

    # --- moves by content (indexer/storage/sql/move_rows.py) ---------------------------------------------------------
    def move_files(self, name: str, moves: FileMoves) -> None: ...

    def copies_of(self, name: str, shas: Sequence[str]) -> dict[str, list[FileCopy]]: ...

    def files_with(self, name: str, shas: Sequence[str]) -> dict[str, tuple[str, FileState]]: ...

    # --- the vector engine: a store is opened on first use ---------------------------------------------
    def search(
        self,
        collection: str,
        vector: np.ndarray,
        k: int,
        filters: SearchFilters | None = None,
        *,
        vector_key: str | None = None,
    ) -> list[Hit]: ...

    # --- model generations (indexer/storage/catalog_generations.py) ---------------------------------------------
    def generation_status(self, name: str) -> MigrationStatus: ...

    def migrations(self) -> dict[int, tuple[str, int]]: ...

    def begin_shadow(self, name: str, model: str, dim: int) -> Generation: ...

    def check_shadow(self, name: str, model: str, dim: int) -> CollectionState: ...

    def shadow_missing(self, name: str, generation: Generation, limit: int, after: int = 0) -> list[int]: ...

    def put_shadow(self, generation: Generation, ids: Sequence[int], vectors: np.ndarray) -> int: ...

    def generation_ids(self, generation: Generation) -> np.ndarray: ...

    def generation_vectors(self, generation: Generation, ids: Sequence[int]) -> np.ndarray: ...

    def prepare_generation(self, name: str, generation: Generation) -> bool: ...

    def swap_generation(self, name: str, role: str) -> CollectionState: ...

    def drop_generation(self, name: str, role: str) -> Generation: ...

    def record_model_source(self, model: str, directory: str) -> None: ...

    def model_source(self, model: str) -> str | None: ...

    def release_older_generations(self) -> None: ...

    def previous_generation(self, state: CollectionState) -> Generation | None: ...

    def vector_count(self, collection: str) -> int: ...

    def flush(self, names: Sequence[str] = ()) -> None: ...

    def rebuild(self, name: str, on_progress: Progress | None = None) -> int: ...

    def reconcile_all(self) -> None: ...

    def ping(self) -> None:
        """One cheap read of the database; raises `DatabaseUnavailable` when it does not answer."""

    def close(self) -> None: ...
