"""The collection service: the one door to storage. Routes, CLI commands, the indexing pipeline and
the demo call it; nothing else outside indexer/ touches the catalog.

Rules it owns, each once: a collection only takes and answers vectors of the model it was embedded
with (reads and writes alike: 422 "re-index with this model"); names follow indexer/domain/names.py and are
unique case-insensitively; a catalog holds at most `max_collections`; an index description is
validated by the engine before a collection is created; adding to or searching the wrong kind of
collection says which kind it is; a user's deletion is remembered (pruned and replaced rows are
not). Search = vector search + row fetch + filters; a hit whose row was deleted between the two is
dropped, never returned half-empty.

Its features are objects it holds, each over the ports it needs (indexer/service/ports.py):
`resolver` (which collection a request means, read from SQL alone, indexer/service/resolver.py),
`search` (search_cases.py), `writes` (additions and uploads, write_cases.py), `texts` (text in
photos, texts.py), `migration`, `duplicates` and `moves`. Its own methods and the blocking features
are synchronous and thread-safe like the catalog (the API calls them from worker threads); the
searches and uploads that need the model are async and run the blocking parts off the event loop.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from indexer.config import StorageSettings
from indexer.domain.names import check_collection_name
from indexer.domain.records import (
    CollectionInfo,
    CollectionKind,
    CollectionState,
    DeleteReason,
    FileState,
    ItemRecord,
    ModelIdentity,
    Progress,
    TakenSource,
)
from indexer.domain.results import CollectionStats
from indexer.errors import VectorStoreError
from indexer.service.duplicate_cases import DuplicateCases
from indexer.service.migration_cases import MigrationCases
from indexer.service.move_cases import MoveCases
from indexer.service.ports import Catalog
from indexer.service.resolver import CollectionResolver, check_kind
from indexer.service.search_cases import SearchCases
from indexer.service.texts import TextCases
from indexer.service.thumbnails import item_thumbnail, thumbnail_path
from indexer.service.write_cases import WriteCases
from retrieval.errors import Conflict, EncoderUnavailable, NotFound
from retrieval.preprocess import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS
from retrieval.types import Encoder


class CollectionService:
    """Use cases over a catalog, for the model of `encoder` (None: a process that embeds nothing,
    such as `cnclip stats`; it can read and delete, not search or add) and of `encoders` (more models
    a server holds: a collection is answered by its active model's, indexer/service/migration_cases.py).
    The feature services it holds over the catalog's ports: `migration` (which model answers a collection),
    `resolver` (which collection a request means), `search`, `writes` (additions, uploads), `duplicates`,
    `moves` (by content) and `texts` (text in photos; its OCR reader: the runtime's)."""

    def __init__(
        self,
        catalog: Catalog,
        encoder: Encoder | None,
        *,
        default_index: str = "Flat",
        max_collections: int = 1000,
        default_ttl_s: float = 0.5,
        max_image_bytes: int = DEFAULT_MAX_BYTES,
        max_image_pixels: int = DEFAULT_MAX_PIXELS,
        thumbs_dir: Path | None = None,
        duplicate_threshold: float | None = None,
        duplicate_budget_s: float = 10.0,
        encoders: Sequence[Encoder] = (),
    ) -> None:
        self.catalog = catalog
        self.encoder = encoder
        self.model = ModelIdentity(encoder.model_id, encoder.dim) if encoder is not None else None
        self.default_index = default_index
        self.max_collections = max_collections
        self.max_image_bytes = max_image_bytes
        self.max_image_pixels = max_image_pixels
        self.thumbs_dir = thumbs_dir
        prune = functools.partial(self.delete_items, reason="pruned")  # a migration's `prune_missing`
        self.migration = MigrationCases(catalog, catalog.generations, encoder, encoders, prune)
        self.resolver = CollectionResolver(catalog, self.migration, default_ttl_s)
        self.texts = TextCases(catalog, None)  # the composition root hands it the OCR reader
        self.search = SearchCases(catalog, self.resolver, self.migration)
        self.writes = WriteCases(
            catalog,
            self.resolver,
            self.migration,
            self.texts,
            max_image_bytes=max_image_bytes,
            max_image_pixels=max_image_pixels,
        )
        self.duplicates = DuplicateCases(
            catalog,
            catalog.duplicates,
            self.migration.encoder_for,
            check_kind,
            threshold=duplicate_threshold,
            budget_s=duplicate_budget_s,
        )
        self.moves = MoveCases(catalog, catalog, catalog.moves, self.resolver.writable, thumbs_dir)

    # --- the rules ----------------------------------------------------------------------------
    def _model(self) -> ModelIdentity:
        if self.model is None:
            raise EncoderUnavailable("this process runs no model: it cannot embed, search or add")
        return self.model

    def check_model(self, info: CollectionInfo | CollectionState) -> None:
        """A collection embedded by another model (or with other dims) can be neither searched nor
        added to with this one: its vectors and ours are not comparable."""
        self.migration.encoder_for(info)

    # --- collections ------------------------------------------------------------------------------
    def create(self, name: str, kind: CollectionKind, index: str | None = None) -> CollectionInfo:
        """A new empty collection for this model's vectors (409 when the name is taken or the
        catalog is full)."""
        model = self._model()
        check_collection_name(name)
        if len(self.catalog.collections()) >= self.max_collections:
            raise Conflict(
                f"the catalog holds {self.max_collections} collections, the most CNCLIP_MAX_COLLECTIONS allows; "
                "delete one first"
            )
        description = self.default_index if index is None else index
        info = self.catalog.create_collection(name, kind, model.model_id, model.dim, description)
        self.resolver.forget_defaults(kind)
        return info

    def ensure(self, name: str, kind: CollectionKind, index: str | None = None) -> CollectionState:
        """The collection `name` for this model, created when missing (the indexing CLI)."""
        try:
            state = self.catalog.collection(check_collection_name(name))
        except NotFound:
            with contextlib.suppress(Conflict):  # Conflict: created by another process just now
                self.create(name, kind, index)
            state = self.catalog.collection(name)
        check_kind(state, kind, "indexing " + kind)
        self.check_model(state)
        return state

    def get(self, name: str) -> CollectionInfo:
        return self.catalog.get_collection(check_collection_name(name))

    def list_all(self) -> list[tuple[CollectionInfo, bool]]:
        """Every collection and whether searches use it when none is named."""
        infos = self.catalog.list_collections()
        defaults = {next((i.id for i in infos if i.kind == kind), None) for kind in ("images", "texts")}
        return [(info, info.id in defaults) for info in infos]

    def delete_collection(self, name: str) -> int:
        removed = self.catalog.delete_collection(check_collection_name(name))
        self.resolver.forget_defaults()
        return removed

    # --- writes ----------------------------------------------------------------------------------
    def set_taken(self, name: str, updates: Sequence[tuple[int, datetime, TakenSource]]) -> None:
        """Date photos indexed before taken_at existed (`cnclip index` reads their files again)."""
        self.catalog.set_taken(self.resolver.writable(name, "images").name, updates)

    def update_files(self, name: str, moves: Sequence[tuple[int, str, int, float]]) -> None:
        """Record (item id, new path, size, mtime) of files renamed or touched without new content."""
        self.catalog.update_files(self.resolver.writable(name, "images").name, moves)

    def delete_items(self, item_ids: Sequence[int], *, reason: DeleteReason = "user") -> int:
        """Delete items. A user's deletion is remembered, so the next `cnclip index` of the folder does
        not bring the same bytes back (unless `--restore-deleted`); pruned and replaced rows are not.
        A deleted image's cached thumbnail goes with it."""
        items = self.catalog.get_many(item_ids) if self.thumbs_dir is not None else []
        removed = self.catalog.delete(item_ids, reason=reason, remember=reason == "user")
        for item in items:  # after the commit: a cache file that will not go never undoes the answer
            if item.kind == "images" and item.sha256 and self.thumbs_dir is not None:
                with contextlib.suppress(OSError):  # served by item id only, and the item is gone
                    thumbnail_path(self.thumbs_dir, item.sha256).unlink(missing_ok=True)
        return removed

    # --- what the indexing pipeline reads and keeps -------------------------------------------------
    def file_states(self, name: str) -> dict[str, FileState]:
        """Path -> state of every bulk-indexed file of the collection (for incremental runs)."""
        return self.catalog.file_states(check_collection_name(name))

    def content_index(self, name: str) -> dict[str, tuple[int, str | None]]:
        """sha256 -> (item id, path) of every item of the collection (dedupe and rename detection)."""
        return self.catalog.content_index(check_collection_name(name))

    def remembered_deletions(self, name: str) -> set[str]:
        """sha256 of the items a user deleted from the collection (and did not restore)."""
        return self.catalog.remembered_deletions(check_collection_name(name))

    def forget_deletions(self, name: str) -> int:
        """`--restore-deleted`: the next index run may add the deleted bytes again."""
        return self.catalog.forget_deletions(check_collection_name(name))

    def flush(self, name: str) -> None:
        """Bring the collection's vector store up to date and save it (the end of a bulk run); a store
        another process holds is left to it (it catches up from SQL)."""
        self.catalog.flush([check_collection_name(name)])

    # --- items ---------------------------------------------------------------------------------------
    def item(self, item_id: int) -> ItemRecord:
        return self.catalog.get(item_id)

    def media(self, item_id: int) -> tuple[ItemRecord, bytes]:
        """The item and its image bytes, while they are still the bytes that were indexed
        (`MediaChanged` once they are not, `NotFound` for a missing file or a text)."""
        item = self.catalog.get(item_id)
        return item, self.catalog.read_media(item)

    def thumbnail(self, item_id: int) -> bytes:
        """The item's JPEG thumbnail, made from the verified indexed bytes and cached by content."""
        if self.thumbs_dir is None:
            raise NotFound("this process keeps no thumbnails")
        item = self.catalog.get(item_id)
        return item_thumbnail(item, self.catalog, self.thumbs_dir, self.max_image_pixels)

    # --- upkeep ------------------------------------------------------------------------------------------
    def stats(self) -> list[CollectionStats]:
        """Per collection: SQL's items and remembered deletions, and the engine's vectors, counted
        after its store is opened (and so reconciled with SQL). Answered from SQL when the engine
        cannot be used now: `vectors` None with the reason (a Milvus Lite file another process holds)."""
        rows = []
        for info in self.catalog.list_collections():
            vectors: int | None = None
            problem: str | None = None
            try:
                vectors = self.catalog.vector_count(info.name)
            except VectorStoreError as exc:
                problem = exc.message
            deleted = self.catalog.remembered_count(info.name)
            rows.append(CollectionStats(info, vectors, problem, deleted))
        return rows

    def rebuild(self, name: str, on_progress: Progress | None = None) -> int:
        """Drop the collection's vector store and fill it again from SQL (`cnclip reindex`)."""
        self.catalog.collection(check_collection_name(name))  # a missing collection is one line, before any bar
        return self.catalog.rebuild(name, on_progress)

    def ping(self) -> None:
        """One cheap read of the database; `DatabaseUnavailable` when it does not answer."""
        self.catalog.ping()


def collection_service(
    catalog: Catalog, encoder: Encoder | None, settings: StorageSettings, encoders: Sequence[Encoder] = ()
) -> CollectionService:
    """The service for `encoder`'s model with the catalog settings (defaults, cap, refresh, limits)."""
    return CollectionService(
        catalog,
        encoder,
        default_index=settings.index_factory,
        max_collections=settings.max_collections,
        default_ttl_s=settings.sync_interval_s,
        max_image_bytes=settings.max_image_bytes,
        max_image_pixels=settings.max_image_pixels,
        thumbs_dir=settings.data_dir / "thumbs",
        duplicate_threshold=settings.duplicate_threshold,
        duplicate_budget_s=settings.duplicate_time_budget_s,
        encoders=encoders,
    )
