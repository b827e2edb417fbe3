"""The part every search shares: pick the collection, search FAISS, fetch the rows, shape the
results, time each stage. Routes only decide where the query vector comes from."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from api.blocking import run_blocking
from api.schemas import Filters, ItemOut, SearchResult
from indexer.types import Catalog, CollectionInfo, CollectionKind, ItemRecord, SearchFilters
from retrieval.errors import InvalidInput, NotFound
from retrieval.manifest import same_model
from retrieval.types import Encoder


class StageTimer:
    """Milliseconds per named stage, in the order they ran, plus `total` on `finish()`."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self._last = self.started
        self.timings: dict[str, float] = {}

    def mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round((now - self._last) * 1000.0, 3)
        self._last = now

    def finish(self) -> dict[str, float]:
        self.timings["total"] = round((time.perf_counter() - self.started) * 1000.0, 3)
        return self.timings


def image_urls(item: ItemRecord) -> tuple[str | None, str | None]:
    if item.kind != "images":
        return None, None
    return f"/v1/items/{item.id}/image", f"/v1/items/{item.id}/thumbnail"


def item_out(item: ItemRecord) -> ItemOut:
    image_url, thumbnail_url = image_urls(item)
    return ItemOut(
        id=item.id,
        collection=item.collection,
        kind=item.kind,
        caption=item.caption,
        tags=list(item.tags),
        mime=item.mime,
        size=item.size,
        width=item.width,
        height=item.height,
        image_url=image_url,
        thumbnail_url=thumbnail_url,
        created_at=item.created_at,
    )


def to_search_filters(filters: Filters | None) -> SearchFilters | None:
    if filters is None:
        return None
    return SearchFilters(tags=filters.tags, mime=filters.mime, date_from=filters.date_from, date_to=filters.date_to)


class CollectionDirectory:
    """Name, kind, model and dimension of collections, remembered after the first lookup.

    The catalog's `get_collection` / `default_collection` also count items, which is a scan of the
    collection's rows; a search needs none of that. Collections are never renamed, dropped or
    re-kinded, and the default of a kind (the oldest) never changes once it exists, so what is
    remembered stays true; only "none yet" is asked again each time.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, CollectionInfo] = {}
        self._default: dict[str, str] = {}

    async def resolve(self, catalog: Catalog, name: str | None, kind: CollectionKind) -> CollectionInfo:
        """The named collection (404 when unknown) or the default one of `kind`; it must hold `kind`."""
        if name is None:
            name = self._default.get(kind)
            if name is None:
                info = await run_blocking(catalog.default_collection, kind)
                if info is None:
                    noun = "image" if kind == "images" else "text"
                    raise NotFound(f"there is no {noun} collection yet; add one (cnclip index ...) or name one")
                self._default[kind] = info.name
                self._by_name[info.name] = info
                return info
        info = self._by_name.get(name)
        if info is None:
            info = await run_blocking(catalog.get_collection, name)
            self._by_name[name] = info
        if info.kind != kind:
            raise InvalidInput(f"collection {name!r} holds {info.kind}, but this search needs {kind}")
        return info


async def resolve_collection(
    directory: CollectionDirectory, catalog: Catalog, name: str | None, kind: CollectionKind, encoder: Encoder
) -> CollectionInfo:
    """The collection a search runs on, checked against the encoder's model and vector dimension."""
    info = await directory.resolve(catalog, name, kind)
    if info.dim != encoder.dim or not same_model(info.model, encoder.model_id):
        raise InvalidInput(
            f"collection {info.name!r} was indexed with {info.model} ({info.dim}-d vectors); "
            f"the server runs {encoder.model_id} ({encoder.dim}-d). Re-index it with this model."
        )
    return info


def _search_and_fetch(
    catalog: Catalog,
    collection: str,
    vector: np.ndarray,
    k: int,
    filters: SearchFilters | None,
    timer: StageTimer,
    exclude: int | None,
) -> list[tuple[float, ItemRecord]]:
    # One worker-thread hop for both, timed separately.
    hits = catalog.search(collection, vector, k + (1 if exclude is not None else 0), filters)
    hits = [h for h in hits if h.id != exclude][:k]
    timer.mark("search")
    records = {r.id: r for r in catalog.get_many([h.id for h in hits])}
    timer.mark("db")
    # A hit whose row was deleted between the two calls is dropped, never returned half-empty.
    return [(h.score, records[h.id]) for h in hits if h.id in records]


async def search_by_vector(
    catalog: Catalog,
    collection: str,
    vector: np.ndarray,
    k: int,
    filters: SearchFilters | None,
    timer: StageTimer,
    exclude: int | None = None,
) -> list[SearchResult]:
    """Top-k items of `collection` for one query vector; `exclude` leaves out one id (the query item)."""
    rows: Sequence[tuple[float, ItemRecord]] = await run_blocking(
        _search_and_fetch, catalog, collection, np.asarray(vector, dtype=np.float32), k, filters, timer, exclude
    )
    results = []
    for score, item in rows:
        image_url, thumbnail_url = image_urls(item)
        results.append(
            SearchResult(
                id=item.id,
                score=round(float(score), 6),
                caption=item.caption,
                tags=list(item.tags),
                image_url=image_url,
                thumbnail_url=thumbnail_url,
                width=item.width,
                height=item.height,
            )
        )
    return results
