"""The collection service: the one place that owns the rules around collections. Routes and CLI
commands are thin callers of it.

Rules it owns: a collection only takes and answers vectors of the model it was embedded with
(reads and writes alike: 422 "re-index with this model"); names follow indexer/names.py and are
unique case-insensitively; a catalog holds at most `max_collections`; an index description is
validated by the engine before a collection is created; adding to or searching the wrong kind of
collection says which kind it is. Search = vector search + row fetch + filters; a hit whose row
was deleted between the two is dropped, never returned half-empty.

Synchronous and thread-safe like the catalog: the API calls it from worker threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np

from indexer import duplicate_rows
from indexer.catalog import SqlCatalog
from indexer.duplicate_pages import TierChoice
from indexer.duplicates import DuplicateFinder, DuplicatesPage
from indexer.media_check import MediaChanged, read_media
from indexer.names import check_collection_name
from indexer.paging import PageRequest, rank
from indexer.perceptual import phash_of_bytes
from indexer.taken import sort_keys, taken_of
from indexer.types import (
    AddResult,
    CollectionInfo,
    CollectionKind,
    ItemRecord,
    NewImage,
    NewText,
    SearchFilters,
    TakenSource,
)
from retrieval.errors import Conflict, InvalidInput, NotFound
from retrieval.manifest import same_model
from retrieval.types import Encoder

_NOUNS = {"images": "image", "texts": "text"}


@dataclass(frozen=True)
class ModelIdentity:
    """The model this process embeds with (the encoder's id and vector size)."""

    model_id: str
    dim: int


@dataclass(frozen=True)
class Found:
    score: float
    item: ItemRecord


@dataclass(frozen=True)
class SearchPage:
    """One page of results and what is known of the whole list (indexer/paging.py)."""

    collection: CollectionInfo
    results: list[Found]
    page: PageRequest
    total: int  # results above the cutoff among the candidates
    total_exact: bool  # False: more pass than the candidate pool holds (`total` is a lower bound)
    has_more: bool
    below_cutoff: int  # how many candidates fell below min_score


StageMark = Callable[[str], None]


class CollectionService:
    """Use cases over a catalog for one model."""

    def __init__(
        self,
        catalog: SqlCatalog,
        model: ModelIdentity,
        *,
        default_factory: str = "Flat",
        max_collections: int = 1000,
        default_ttl_s: float = 0.5,
        duplicate_threshold: float | None = None,
        duplicate_budget_s: float = 10.0,
    ) -> None:
        self.catalog = catalog
        self.model = model
        self.default_factory = default_factory
        self.max_collections = max_collections
        self.default_ttl_s = default_ttl_s
        self._defaults: dict[str, tuple[float, str]] = {}  # kind -> (when looked up, name)
        self.duplicate_budget_s = duplicate_budget_s
        self.finder = DuplicateFinder(catalog, threshold=duplicate_threshold)

    # --- the rules ----------------------------------------------------------------------------
    def check_model(self, info: CollectionInfo) -> None:
        """A collection embedded by another model (or with other dims) can be neither searched nor
        added to with this one: its vectors and ours are not comparable."""
        if info.dim != self.model.dim or not same_model(info.model, self.model.model_id):
            raise InvalidInput(
                f"collection {info.name!r} was indexed with {info.model} ({info.dim}-d vectors); "
                f"the server runs {self.model.model_id} ({self.model.dim}-d). Re-index it with this model."
            )

    @staticmethod
    def check_kind(info: CollectionInfo, kind: CollectionKind, action: str) -> None:
        if info.kind != kind:
            raise InvalidInput(
                f"collection {info.name!r} holds {info.kind}; {action} needs an {_NOUNS[kind]} collection"
            )

    # --- lifecycle ------------------------------------------------------------------------------
    def create(self, name: str, kind: CollectionKind, index: str | None = None) -> CollectionInfo:
        """A new empty collection for this model's vectors (409 when the name is taken or the
        catalog is full)."""
        check_collection_name(name)
        if len(self.catalog.rows.collections()) >= self.max_collections:
            raise Conflict(
                f"the catalog holds {self.max_collections} collections, the most CNCLIP_MAX_COLLECTIONS allows; "
                "delete one first"
            )
        info = self.catalog.create_collection(
            name, kind, self.model.model_id, self.model.dim, self.default_factory if index is None else index
        )
        self._defaults.pop(kind, None)
        return info

    def ensure(self, name: str, kind: CollectionKind, index: str | None = None) -> CollectionInfo:
        """The collection `name` for this model, created when missing (the indexing CLI)."""
        try:
            info = self.catalog.get_collection(check_collection_name(name))
        except NotFound:
            try:
                return self.create(name, kind, index)
            except Conflict:  # created by another process just now
                info = self.catalog.get_collection(name)
        self.check_kind(info, kind, "indexing " + kind)
        self.check_model(info)
        return info

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

    def resolve(self, name: str | None, kind: CollectionKind, action: str = "this search") -> CollectionInfo:
        """The named collection (404 when unknown) or the default of `kind` (the oldest), checked
        for kind and model."""
        if name is None:
            name = self._default_name(kind)
        state = self.catalog.store(check_collection_name(name)).state
        info = CollectionInfo(state.id, state.name, state.kind, state.model, state.dim, state.factory, 0, 0)
        self.check_kind(info, kind, action)
        self.check_model(info)
        return info

    def _default_name(self, kind: CollectionKind) -> str:
        cached = self._defaults.get(kind)
        if cached is not None and time.monotonic() - cached[0] < self.default_ttl_s:
            return cached[1]
        state = next((s for s in self.catalog.rows.collections() if s.kind == kind), None)
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
        engine, cutoff, order, page (indexer/paging.py). `exclude` leaves out one id (the query item);
        `mark(stage)` is called after the vector search and after the row fetch."""
        page.check()
        return self._search(self.resolve(name, kind), vector, page, filters, exclude, mark)

    def _search(
        self,
        info: CollectionInfo,
        vector: np.ndarray,
        page: PageRequest,
        filters: SearchFilters | None,
        exclude: int | None,
        mark: StageMark | None,
    ) -> SearchPage:
        pool = page.candidates()
        hits = self.catalog.search(info.name, vector, pool + (1 if exclude is not None else 0), filters)
        hits = [h for h in hits if h.id != exclude][:pool]
        if mark:
            mark("search")
        above = [h.id for h in hits if page.min_score is None or h.score >= page.min_score]
        dates = sort_keys(self.catalog.rows.engine, above) if page.sort != "relevance" else None
        ranked = rank(hits, pool, page, dates)
        records = {r.id: r for r in self.catalog.get_many([h.id for h in ranked.ids])}
        if mark:
            mark("db")
        # A hit whose row was deleted between the vector search and the row fetch is dropped.
        results = [Found(h.score, records[h.id]) for h in ranked.ids if h.id in records]
        return SearchPage(info, results, page, ranked.total, ranked.total_exact, ranked.has_more, ranked.below_cutoff)

    def similar(
        self, item_id: int, page: PageRequest, filters: SearchFilters | None = None, *, mark: StageMark | None = None
    ) -> SearchPage:
        """Items of the same collection nearest to `item_id`, by its stored vector (comparable with
        the collection's own, whatever model this process runs)."""
        page.check()
        item = self.catalog.get(item_id)
        vector = self.catalog.vector(item_id)
        if mark:
            mark("encode")  # a stored vector: no model call
        return self._search(self.catalog.get_collection(item.collection), vector, page, filters, item_id, mark)

    # --- writes ----------------------------------------------------------------------------------
    def writable(self, name: str, kind: CollectionKind) -> CollectionInfo:
        """The collection `name`, checked before anything is embedded for it."""
        return self.resolve(name, kind, "adding " + kind)

    def add_images(
        self, name: str, images: Sequence[NewImage], vectors: np.ndarray, **kwargs: object
    ) -> list[AddResult]:
        """Add images; each gets its `taken_at` here when the caller did not read it (an upload:
        its EXIF date, else now)."""
        info = self.writable(name, "images")
        dated = [image if image.taken_at is not None else replace(image, **_taken_fields(image)) for image in images]
        hashed = [image if image.phash is not None else replace(image, phash=_phash(image)) for image in dated]
        return self.catalog.add_images(info.name, hashed, vectors, model=self.model.model_id, **kwargs)  # type: ignore[arg-type]

    def set_taken(self, name: str, updates: Sequence[tuple[int, datetime, TakenSource]]) -> None:
        """Date photos indexed before taken_at existed (`cnclip index` reads their files again)."""
        self.catalog.set_taken(self.writable(name, "images").name, updates)

    def set_phashes(self, name: str, updates: Sequence[tuple[int, int]]) -> None:
        """Perceptual hashes of photos indexed before they existed (`cnclip index` reads their files again)."""
        state = self.catalog.state(self.writable(name, "images").name)
        duplicate_rows.set_phashes(self.catalog.engine, state.id, updates)

    def hash_missing(self, name: str, on_progress: Callable[[int, int], None] | None = None, chunk: int = 200) -> int:
        """Perceptual hashes of every image that has none, uploads included (`cnclip duplicates
        --hash-missing`), read from the verified indexed bytes; an image whose file is gone or changed is
        left as it is. Returns how many were hashed."""
        state = self.catalog.state(self.writable(name, "images").name)
        missing = duplicate_rows.unhashed_ids(self.catalog.engine, state.id)
        hashed = 0
        for start in range(0, len(missing), chunk):
            updates = []
            for record in self.catalog.get_many(missing[start : start + chunk]):
                try:
                    phash = phash_of_bytes(read_media(record, self.catalog.media_dir))
                except (NotFound, MediaChanged):
                    continue
                if phash is not None:
                    updates.append((record.id, phash))
            if updates:
                duplicate_rows.set_phashes(self.catalog.engine, state.id, updates)
            hashed += len(updates)
            if on_progress:
                on_progress(min(start + chunk, len(missing)), len(missing))
        return hashed

    def record_copies(self, name: str, copies: Sequence[duplicate_rows.FileCopy]) -> None:
        """Files with the bytes of an item at another path (`cnclip index`; indexer/duplicate_rows.py)."""
        state = self.catalog.state(self.writable(name, "images").name)
        duplicate_rows.record_copies(self.catalog.engine, state.id, copies)

    def prune_copies(self, name: str) -> int:
        """Forget recorded copies whose files are gone (`cnclip index --prune`)."""
        return duplicate_rows.prune_copies(self.catalog.engine, self.catalog.state(name).id)

    def duplicates(
        self,
        name: str,
        tier: TierChoice = "all",
        offset: int = 0,
        limit: int = 20,
        *,
        budget_s: float | None = -1.0,
        threshold: float | None = None,
    ) -> DuplicatesPage:
        """One page of a collection's near-duplicate groups (indexer/duplicates.py). `budget_s`: how long
        the similar-shots search may run in this call (the service's default when negative; None: until
        done); past it the answer is partial (`complete` False) and the next call goes on from there.
        Read-only: the groups come from stored vectors and hashes, whatever model this process runs."""
        state = self.catalog.state(check_collection_name(name))
        info = CollectionInfo(state.id, state.name, state.kind, state.model, state.dim, state.factory, 0, 0)
        self.check_kind(info, "images", "finding duplicates")
        budget = self.duplicate_budget_s if budget_s is not None and budget_s < 0 else budget_s
        return self.finder.find(state, tier, offset, limit, budget_s=budget, threshold=threshold)

    def add_texts(self, name: str, texts: Sequence[NewText], vectors: np.ndarray) -> list[AddResult]:
        info = self.writable(name, "texts")
        return self.catalog.add_texts(info.name, texts, vectors, model=self.model.model_id)

    def delete_items(self, item_ids: Sequence[int]) -> int:
        """A user's deletion: remembered, so the next `cnclip index` of the folder does not bring
        the same bytes back (unless `--restore-deleted`)."""
        return self.catalog.delete(item_ids, reason="user")


def _phash(image: NewImage) -> int | None:
    return phash_of_bytes(image.data)


def _taken_fields(image: NewImage) -> dict[str, Any]:
    moment, source = taken_of(image.data, image.mtime)
    return {"taken_at": moment, "taken_source": source}


def collection_service(catalog: SqlCatalog, encoder: Encoder, settings: Any) -> CollectionService:
    """The service for `encoder`'s model with the catalog settings (defaults, cap, refresh)."""
    return CollectionService(
        catalog,
        ModelIdentity(encoder.model_id, encoder.dim),
        default_factory=settings.index_factory,
        max_collections=settings.max_collections,
        default_ttl_s=settings.sync_interval_s,
        duplicate_threshold=settings.duplicate_threshold,
        duplicate_budget_s=settings.duplicate_time_budget_s,
    )
