"""What the collection service needs of storage, one port per concern. indexer/storage/catalog.py's
`SqlCatalog` implements the core ports itself and holds the feature stores (`duplicates`,
`generations`, `moves`, `texts`); the service (indexer/service/collections.py) and each of its feature
services code against the ports they use, never against SQL or an engine.

Synchronous and thread-safe: the API calls them from worker threads (never on the event loop). One
writer at a time; searches run concurrently with writes. Unknown collections or items raise
`retrieval.errors.NotFound`. Storage stores what it is given: the rules are the service's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

import numpy as np

from indexer.domain.duplicates import Calibration, FileCopy
from indexer.domain.generations import Generation, MigrationStatus
from indexer.domain.item_texts import ItemText, RecognisedText
from indexer.domain.records import (
    AddResult,
    CollectionInfo,
    CollectionKind,
    CollectionState,
    FileMoves,
    FileState,
    Hit,
    ItemRecord,
    NewImage,
    NewText,
    Progress,
    SearchFilters,
    TakenSource,
)
from indexer.domain.text_query import TextMatches


class CollectionStore(Protocol):
    """Collections: SQL only, never a vector store."""

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


class ItemStore(Protocol):
    """Items: their rows and stored vectors, written and read."""

    def add_images(
        self,
        collection: CollectionState | str,
        images: Sequence[NewImage],
        vectors: np.ndarray,
        *,
        replace: Sequence[int | None] | None = None,
        vector_key: str | None = None,
    ) -> list[AddResult]: ...

    def load_images(
        self,
        collection: CollectionState,
        images: Sequence[NewImage],
        vectors: np.ndarray,
        *,
        replace: Sequence[int | None] | None = None,
        vector_key: str | None = None,
    ) -> list[AddResult]:
        """`add_images` for a bulk load of many rows (one shard of `cnclip index --ray`): the same rules in
        one transaction, the rows written the fastest way the database has (PostgreSQL: COPY)."""

    def add_texts(
        self,
        collection: CollectionState | str,
        texts: Sequence[NewText],
        vectors: np.ndarray,
        *,
        vector_key: str | None = None,
    ) -> list[AddResult]: ...

    def delete(self, item_ids: Sequence[int], *, reason: str, remember: bool) -> int: ...

    def get(self, item_id: int) -> ItemRecord: ...

    def get_many(self, item_ids: Sequence[int]) -> list[ItemRecord]:
        """Records in the order of `item_ids`; ids that do not exist are left out."""

    def vector(self, item_id: int) -> np.ndarray:
        """The stored vector of an item (for "similar images" by id)."""

    def vectors_for(self, collection: str, ids: Sequence[int], vector_key: str) -> np.ndarray:
        """Stored vectors of `ids` of the collection's generation `vector_key` (active or previous)."""

    def sort_keys(self, item_ids: Sequence[int]) -> dict[int, tuple[datetime | None, datetime | None]]: ...


class FileStore(Protocol):
    """Bulk-indexed files: what an incremental run reads, and what it records without embedding."""

    def file_states(self, collection: str) -> dict[str, FileState]: ...

    def content_index(self, collection: str) -> dict[str, tuple[int, str | None]]: ...

    def update_files(self, collection: str, moves: Sequence[tuple[int, str, int, float]]) -> None: ...

    def set_taken(self, collection: str, updates: Sequence[tuple[int, datetime, TakenSource]]) -> None: ...


class MoveStore(Protocol):
    """Moves by content (indexer/bulk/moves.py): one pass's path changes, and where bytes are now.
    Keyed by the collection's id (the caller resolved it)."""

    def move_files(self, collection_id: int, moves: FileMoves) -> None: ...

    def copies_of(self, collection_id: int, shas: Sequence[str]) -> dict[str, list[FileCopy]]: ...

    def files_with(self, collection_id: int, shas: Sequence[str]) -> dict[str, tuple[str, FileState]]: ...


class MediaStore(Protocol):
    """An item's indexed bytes (indexer/storage/media/check.py)."""

    def read_media(self, item: ItemRecord) -> bytes:
        """The item's image bytes, exactly as indexed; `NotFound` / `MediaChanged`."""

    def check_media(self, item: ItemRecord) -> None: ...


class VectorIndex(Protocol):
    """The vector engine behind the rows (a store is opened on first use), and the upkeep of both."""

    def search(
        self,
        collection: str,
        vector: np.ndarray,
        k: int,
        filters: SearchFilters | None = None,
        *,
        vector_key: str | None = None,
    ) -> list[Hit]: ...

    def vector_count(self, collection: str) -> int: ...

    def flush(self, names: Sequence[str] = ()) -> None: ...

    def rebuild(self, name: str, on_progress: Progress | None = None) -> int: ...

    def reconcile_all(self) -> None: ...

    def ping(self) -> None:
        """One cheap read of the database; raises `DatabaseUnavailable` when it does not answer."""

    def close(self) -> None: ...


class DuplicateStore(Protocol):
    """What near-duplicate groups are made of (indexer/service/duplicates.py): stored ids, vectors and
    perceptual hashes, the copies `cnclip index` meets, the similar-shots calibration. Keyed by the
    collection's id (the caller resolved it)."""

    def item_ids(self, collection_id: int) -> np.ndarray:
        """The collection's item ids, sorted."""

    def vectors(self, ids: np.ndarray | Sequence[int]) -> np.ndarray:
        """Stored vectors of `ids`, in that order (a zero row for an id deleted meanwhile)."""

    def changes(self, collection_id: int, since: int, until: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids added, ids deleted) by the versions in (since, until]."""

    def item_count(self, collection_id: int) -> int: ...

    def hashed_items(self, collection_id: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, perceptual hashes) of the items that have one."""

    def phashes_of(self, ids: Sequence[int]) -> dict[int, int]: ...

    def unhashed_ids(self, collection_id: int) -> list[int]: ...

    def unhashed_count(self, collection_id: int) -> int: ...

    def set_phashes(self, collection_id: int, updates: Sequence[tuple[int, int]]) -> None: ...

    def exif_times(self, collection_id: int) -> dict[int, float]:
        """Item id -> EXIF date taken (epoch seconds), for items that have one."""

    def copies_by_item(self, collection_id: int) -> dict[int, list[FileCopy]]: ...

    def record_copies(self, collection_id: int, copies: Sequence[FileCopy]) -> None: ...

    def prune_copies(self, collection_id: int) -> int: ...

    def calibration(self, collection_id: int) -> Calibration | None:
        """The stored similar-shots calibration, or None (none yet, or unreadable)."""

    def save_calibration(self, collection_id: int, calibration: Calibration) -> None: ...


class GenerationStore(Protocol):
    """A collection's model generations (`cnclip migrate`): the shadow filled with the next model, the
    swap, rollback and dropping, each generation's own vector store, and where models live."""

    def status(self, name: str) -> MigrationStatus: ...

    def shadows(self) -> dict[int, tuple[str, int]]:
        """collection id -> (the model it migrates to, items its shadow covers)."""

    def begin_shadow(self, name: str, model: str, dim: int) -> Generation: ...

    def check_shadow(self, name: str, model: str, dim: int) -> CollectionState: ...

    def shadow_missing(self, name: str, generation: Generation, limit: int, after: int = 0) -> list[int]: ...

    def put_shadow(self, generation: Generation, ids: Sequence[int], vectors: np.ndarray) -> int: ...

    def covered_ids(self, generation: Generation) -> np.ndarray: ...

    def vectors_of(self, generation: Generation, ids: Sequence[int]) -> np.ndarray: ...

    def prepare(self, name: str, generation: Generation) -> bool: ...

    def swap(self, name: str, role: str) -> CollectionState: ...

    def drop(self, name: str, role: str) -> Generation: ...

    def previous(self, state: CollectionState) -> Generation | None: ...

    def release_older(self) -> None: ...

    def record_model_source(self, model: str, directory: str) -> None: ...

    def model_source(self, model: str) -> str | None: ...


class Texts(Protocol):
    """What the service and the indexing pipeline need of the store of text recognised in photos
    (indexer/storage/texts.py `TextStore`, held as `Catalog.texts`; issue 32)."""

    def set_ocr(self, collection: str, on: bool) -> None: ...

    def put_texts(self, collection: str, texts: Mapping[int, RecognisedText]) -> int: ...

    def texts_missing(self, collection: str, after: int, limit: int) -> list[int]: ...

    def text_counts(self, collection: str) -> tuple[int, int]: ...

    def texts_for(self, item_ids: Sequence[int]) -> dict[int, ItemText]: ...

    def search_texts(
        self, target: CollectionState, pieces: Sequence[str], filters: SearchFilters | None, limit: int
    ) -> TextMatches:
        """Items of `target` whose text holds every piece (normal form), best first (indexer/storage/sql/text_search.py)."""


class ItemLibrary(CollectionStore, ItemStore, MediaStore, Protocol):
    """Collections, their items and the items' bytes: what a feature that reads whole items needs."""


class Catalog(ItemLibrary, FileStore, VectorIndex, Protocol):
    """Everything the composition root hands the service: the core ports, and the feature stores the
    feature services take (indexer/service/collections.py builds them from these)."""

    @property
    def duplicates(self) -> DuplicateStore: ...

    @property
    def generations(self) -> GenerationStore: ...

    @property
    def moves(self) -> MoveStore: ...

    @property
    def texts(self) -> Texts: ...
