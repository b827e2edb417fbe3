"""The collection service: the one door to storage. Routes, CLI commands, the indexing pipeline and
the demo call it; nothing else outside indexer/ touches the catalog.

Rules it owns, each once: a collection only takes and answers vectors of the model it was embedded
with (reads and writes alike: 422 "re-index with this model"); names follow indexer/domain/names.py and are
unique case-insensitively; a catalog holds at most `max_collections`; an index description is
validated by the engine before a collection is created; adding to or searching the wrong kind of
collection says which kind it is; a user's deletion is remembered (pruned and replaced rows are
not). Search = vector search + row fetch + filters; a hit whose row was deleted between the two is
dropped, never returned half-empty.

Which collection a request means (`resolve`) is read from SQL alone: only a search opens the
collection's vector store, so a process that only writes (`cnclip index`) never needs the engine
until its final flush.

The methods are synchronous and thread-safe like the catalog (the API calls them from worker
threads); the use cases that also need the model (a text or image search, an upload) are async and
run the blocking parts off the event loop (indexer/service/use_cases.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from indexer.bulk.moves import MoveCases
from indexer.domain.exclusion import Exclusion, pushed_away
from indexer.domain.names import check_collection_name
from indexer.domain.paging import MAX_CANDIDATES, PageRequest, rank
from indexer.domain.perceptual import phash_of_bytes
from indexer.domain.records import (
    AddResult,
    Catalog,
    CollectionInfo,
    CollectionKind,
    CollectionState,
    FileState,
    ItemRecord,
    NewImage,
    NewText,
    SearchFilters,
    TakenSource,
)
from indexer.domain.results import CollectionStats, Found, SearchPage, StageMark
from indexer.errors import VectorStoreError
from indexer.service.duplicate_cases import DuplicateCases
from indexer.service.migration_cases import MigrationCases
from indexer.service.use_cases import UseCases
from indexer.storage.media.thumbnails import item_thumbnail, thumbnail_path
from indexer.storage.sql.taken import taken_from
from indexer.storage.sync import Progress
from retrieval.errors import Conflict, EncoderUnavailable, InvalidImage, InvalidInput, NotFound
from retrieval.preprocess import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, ImageHeader, read_header
from retrieval.types import Encoder

if TYPE_CHECKING:  # the annotation only
    from indexer.service.model_loader import ModelLoader

_NOUNS = {"images": "image", "texts": "text"}
DeleteReason = Literal["user", "pruned", "replaced"]


@dataclass(frozen=True)
class ModelIdentity:
    """The model this process embeds with (the encoder's id and vector size)."""

    model_id: str
    dim: int


class CollectionService(UseCases, DuplicateCases, MigrationCases, MoveCases):
    """Use cases over a catalog, for the model of `encoder` (None: a process that embeds nothing,
    such as `cnclip stats`; it can read and delete, not search or add) and of `encoders` (more models
    a server holds: a collection is answered by its active model's, indexer/service/migration_cases.py)."""

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
        self.encoders = {e.model_id: e for e in encoders if e is not encoder}
        self.model = ModelIdentity(encoder.model_id, encoder.dim) if encoder is not None else None
        self.default_index = default_index
        self.max_collections = max_collections
        self.default_ttl_s = default_ttl_s
        self.max_image_bytes = max_image_bytes
        self.max_image_pixels = max_image_pixels
        self.thumbs_dir = thumbs_dir
        self.duplicate_threshold = duplicate_threshold
        self.duplicate_budget_s = duplicate_budget_s
        self._defaults: dict[str, tuple[float, str]] = {}  # kind -> (when looked up, name)
        self.model_loader: ModelLoader | None = None  # a server's (indexer/runtime.py): loads swapped-to models

    # --- the rules ----------------------------------------------------------------------------
    def _model(self) -> ModelIdentity:
        if self.model is None:
            raise EncoderUnavailable("this process runs no model: it cannot embed, search or add")
        return self.model

    def check_model(self, info: CollectionInfo | CollectionState) -> None:
        """A collection embedded by another model (or with other dims) can be neither searched nor
        added to with this one: its vectors and ours are not comparable."""
        self.encoder_for(info)

    @staticmethod
    def check_kind(info: CollectionInfo | CollectionState, kind: CollectionKind, action: str) -> None:
        if info.kind != kind:
            raise InvalidInput(
                f"collection {info.name!r} holds {info.kind}; {action} needs an {_NOUNS[kind]} collection"
            )

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
        self._defaults.pop(kind, None)
        return info

    def ensure(self, name: str, kind: CollectionKind, index: str | None = None) -> CollectionState:
        """The collection `name` for this model, created when missing (the indexing CLI)."""
        try:
            state = self.catalog.collection(check_collection_name(name))
        except NotFound:
            with contextlib.suppress(Conflict):  # Conflict: created by another process just now
                self.create(name, kind, index)
            state = self.catalog.collection(name)
        self.check_kind(state, kind, "indexing " + kind)
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
        self._defaults.clear()
        return removed

    def resolve(
        self, name: str | None, kind: CollectionKind, action: str = "this search", *, answer: bool = False
    ) -> CollectionState:
        """The named collection (404 when unknown) or the default of `kind` (the oldest), checked
        for kind and model (indexer/service/migration_cases.py `answering`: with `answer`, a search, the
        generation this process answers with). SQL only: no vector store is opened."""
        if name is None:
            name = self._default_name(kind)
        state = self.catalog.collection(check_collection_name(name))
        self.check_kind(state, kind, action)
        return self.answering(state, search=answer)

    def _default_name(self, kind: CollectionKind) -> str:
        cached = self._defaults.get(kind)
        if cached is not None and time.monotonic() - cached[0] < self.default_ttl_s:
            return cached[1]
        state = next((s for s in self.catalog.collections() if s.kind == kind), None)
        if state is None:
            raise NotFound(f"there is no {_NOUNS[kind]} collection yet; add one (cnclip index ...) or name one")
        self._defaults[kind] = (time.monotonic(), state.name)
        return state.name

    # --- search ----------------------------------------------------------------------------------
    def search(
        self,
        name: str | None,
        kind: CollectionKind,
        vector: np.ndarray,
        page: PageRequest,
        filters: SearchFilters | None = None,
        *,
        exclude: int | None = None,
        mark: StageMark | None = None,
    ) -> SearchPage:
        """One page of a collection's items for a query vector of this model: candidates from the
        engine, cutoff, order, page (indexer/domain/paging.py). `exclude` leaves out one id (the query item);
        `mark(stage)` is called after the vector search and after the row fetch."""
        page.check()
        return self.search_in(self.resolve(name, kind), vector, page, filters, exclude=exclude, mark=mark)

    def search_in(
        self,
        target: CollectionState,
        vector: np.ndarray,
        page: PageRequest,
        filters: SearchFilters | None = None,
        *,
        exclude: int | None = None,
        away: Exclusion | None = None,
        mark: StageMark | None = None,
    ) -> SearchPage:
        """`search` in a collection `resolve` returned (the async use cases resolve before embedding)."""
        pool = page.candidates() if away is None else MAX_CANDIDATES
        wanted = pool + (1 if exclude is not None else 0)
        hits = self.catalog.search(target.name, vector, wanted, filters, vector_key=target.vector_key)
        hits, exact = pushed_away(self.catalog, target, [h for h in hits if h.id != exclude][:pool], pool, page, away)
        if mark:
            mark("search")
        above = [h.id for h in hits if page.min_score is None or h.score >= page.min_score]
        dates = self.catalog.sort_keys(above) if page.sort != "relevance" else None
        ranked = replace(rank(hits, pool, page, dates), total_exact=exact)
        records = {r.id: r for r in self.catalog.get_many([h.id for h in ranked.ids])}
        if mark:
            mark("db")
        # A hit whose row was deleted between the vector search and the row fetch is dropped.
        results = [Found(h.score, records[h.id]) for h in ranked.ids if h.id in records]
        return SearchPage(target, results, page, ranked.total, ranked.total_exact, ranked.has_more, ranked.below_cutoff)

    def similar(
        self, item_id: int, page: PageRequest, filters: SearchFilters | None = None, *, mark: StageMark | None = None
    ) -> SearchPage:
        """Items of the same collection nearest to `item_id`, by its stored vector (comparable with
        the collection's own, whatever model this process runs)."""
        page.check()
        item = self.catalog.get(item_id)
        target, vector = self.stored_vector(item.collection, item_id)
        if mark:
            mark("encode")  # a stored vector: no model call
        return self.search_in(target, vector, page, filters, exclude=item_id, mark=mark)

    # --- writes ----------------------------------------------------------------------------------
    def writable(self, name: str, kind: CollectionKind) -> CollectionState:
        """The collection `name`, checked before anything is embedded for it."""
        return self.resolve(name, kind, "adding " + kind)

    def add_images(
        self,
        name: str,
        images: Sequence[NewImage],
        vectors: np.ndarray,
        *,
        replace: Sequence[int | None] | None = None,
        vector_key: str | None = None,
    ) -> list[AddResult]:
        """Add images. Each comes with what its header says (mime, size, date), read once by the
        caller (`read_header`: the pipeline's reader, an upload's check) or here when it did not;
        its `taken_at` follows indexer/storage/sql/taken.py (an upload: its EXIF date, else now). `vector_key`: the
        generation the vectors were made for (None: the default encoder's, check_generation)."""
        target = self.check_generation(self.writable(name, "images"), vector_key)
        completed = [self.complete(image) for image in images]
        return self.catalog.add_images(target.name, completed, vectors, replace=replace, vector_key=target.vector_key)

    def complete(self, image: NewImage, header: ImageHeader | None = None) -> NewImage:
        """`image` with its header's facts and its date filled in (one header read, when needed), and an
        upload's perceptual hash."""
        if image.mime is None:
            header = header or read_header(image.data, self.max_image_bytes, self.max_image_pixels)
            image = replace(image, mime=header.mime, width=header.width, height=header.height)
        if image.taken_at is None:
            if header is None:  # only the date is missing: bytes whose header cannot be read date by mtime/now
                with contextlib.suppress(InvalidImage):
                    header = read_header(image.data, self.max_image_bytes, self.max_image_pixels)
            taken_at, taken_source = taken_from(header, image.mtime)
            image = replace(image, taken_at=taken_at, taken_source=taken_source)
        if image.phash is None and image.path is None:
            # An upload's perceptual hash (near-duplicates); the bulk indexer's reader takes its files'.
            image = replace(image, phash=phash_of_bytes(image.data, self.max_image_bytes, self.max_image_pixels))
        return image

    def set_taken(self, name: str, updates: Sequence[tuple[int, datetime, TakenSource]]) -> None:
        """Date photos indexed before taken_at existed (`cnclip index` reads their files again)."""
        self.catalog.set_taken(self.writable(name, "images").name, updates)

    def update_files(self, name: str, moves: Sequence[tuple[int, str, int, float]]) -> None:
        """Record (item id, new path, size, mtime) of files renamed or touched without new content."""
        self.catalog.update_files(self.writable(name, "images").name, moves)

    def add_texts(
        self, name: str, texts: Sequence[NewText], vectors: np.ndarray, vector_key: str | None = None
    ) -> list[AddResult]:
        target = self.check_generation(self.writable(name, "texts"), vector_key)
        return self.catalog.add_texts(target.name, texts, vectors, vector_key=target.vector_key)

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
    catalog: Catalog, encoder: Encoder | None, settings: Any, encoders: Sequence[Encoder] = ()
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
