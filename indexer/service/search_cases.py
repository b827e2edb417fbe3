"""The collection service's searches: by text, by image, by an item (its stored vector) and by a
caller's vector. Each async one is one call for a route: resolve the collection (SQL, before any model
work: an unknown collection is a 404 at once), embed, then search, the blocking parts off the event
loop (indexer/service/blocking.py). So a request walks each layer once: route → service → catalog and
engine, and the encoder. Held by `CollectionService` (indexer/service/collections.py) as `search`.

Search = vector search + row fetch + filters; a hit whose row was deleted between the two is dropped,
never returned half-empty. A search that meets a model generation swap embeds again with the new
model (`SWAP_RETRIES`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from indexer.domain.exclusion import Exclusion, excluded_texts, pushed_away
from indexer.domain.paging import MAX_CANDIDATES, PageRequest, rank
from indexer.domain.records import CollectionKind, CollectionState, SearchFilters
from indexer.domain.results import Found, SearchPage, StageMark
from indexer.domain.text_query import SearchMode, split_query
from indexer.errors import GenerationMoved
from indexer.service.blocking import off_loop, warm
from indexer.service.migration_cases import SWAP_RETRIES, MigrationCases
from indexer.service.ports import Catalog
from indexer.service.resolver import CollectionResolver
from indexer.service.text_search import HybridSearch, check_exclusions, default_mode


class SearchCases:
    """Over the catalog's items, vectors and recognised texts (`catalog`); `resolver` says which
    collection a request means, `migration` which encoder answers it and where an item's stored
    vector is."""

    def __init__(self, catalog: Catalog, resolver: CollectionResolver, migration: MigrationCases) -> None:
        self.catalog = catalog
        self.resolver = resolver
        self.migration = migration

    async def text(
        self,
        query: str,
        collection: str | None,
        page: PageRequest,
        filters: SearchFilters | None = None,
        *,
        excluded: Sequence[str] = (),
        mode: SearchMode | None = None,
        mark: StageMark | None = None,
    ) -> SearchPage:
        """Images of `collection` (default: the oldest image collection) matching a text, pushed away
        from the `excluded` texts (indexer/domain/exclusion.py). `mode` (default: the collection's,
        indexer/service/text_search.py): `clip` the vector search of the query as typed; `text` and
        `hybrid` also read the text recognised in the photos, quoted parts a hard filter."""
        page.check()
        texts = excluded_texts(excluded)
        for attempt in range(SWAP_RETRIES + 1):
            # before any model work; the generation this process answers with (a swap's previous meanwhile)
            target = await off_loop(self.resolver.resolve, collection, "images", answer=True)
            chosen = mode or default_mode(target)
            split = None if chosen == "clip" else split_query(query)
            clip_text = query if split is None else split.clip_text if chosen == "hybrid" else ""
            check_exclusions(chosen, texts, clip_text)
            wanted = [clip_text, *texts] if clip_text else list(texts)
            # one batch, cached per text; a text-only search needs no model
            vectors = await warm(self.migration.encoder_for(target)).embed_texts(wanted) if wanted else None
            away = (
                Exclusion.of(texts, vectors[-len(texts) :], target.vector_key)
                if texts and vectors is not None
                else None
            )
            if mark:
                mark("encode")
            try:
                if split is None:
                    assert vectors is not None
                    return await off_loop(self.in_collection, target, vectors[0], page, filters, away=away, mark=mark)
                vector = vectors[0] if clip_text and vectors is not None else None
                hybrid = HybridSearch(self.catalog)
                return await off_loop(hybrid.page, target, split, chosen, vector, page, filters, away=away, mark=mark)
            except GenerationMoved:  # swapped to another model meanwhile: embed again with the new one
                if attempt == SWAP_RETRIES:
                    raise
        raise AssertionError("unreachable")

    async def image(
        self,
        data: bytes,
        collection: str | None,
        target_kind: CollectionKind,
        page: PageRequest,
        filters: SearchFilters | None = None,
        *,
        excluded: Sequence[str] = (),
        mark: StageMark | None = None,
    ) -> SearchPage:
        """Similar images (`target_kind` images) or best-matching texts (texts) for image bytes whose
        header the caller has checked, pushed away from the `excluded` texts."""
        page.check()
        texts = excluded_texts(excluded)
        for attempt in range(SWAP_RETRIES + 1):
            target = await off_loop(self.resolver.resolve, collection, target_kind, answer=True)
            encoder = warm(self.migration.encoder_for(target))
            vector = (await encoder.embed_images([data]))[0]
            away = Exclusion.of(texts, await encoder.embed_texts(list(texts)), target.vector_key) if texts else None
            if mark:
                mark("encode")
            try:
                return await off_loop(self.in_collection, target, vector, page, filters, away=away, mark=mark)
            except GenerationMoved:
                if attempt == SWAP_RETRIES:
                    raise
        raise AssertionError("unreachable")

    async def similar(
        self,
        item_id: int,
        page: PageRequest,
        filters: SearchFilters | None = None,
        *,
        excluded: Sequence[str] = (),
        mark: StageMark | None = None,
    ) -> SearchPage:
        """Items of the same collection nearest to `item_id`, by its stored vector (comparable with the
        collection's own, whatever model this process runs), pushed away from the `excluded` texts,
        embedded by the model of the collection's stored vectors."""
        page.check()
        texts = excluded_texts(excluded)
        if not texts:
            return await off_loop(self._by_stored_vector, item_id, page, filters, mark=mark)
        for attempt in range(SWAP_RETRIES + 1):
            item = await off_loop(self.catalog.get, item_id)
            target, vector = await off_loop(self.migration.stored_vector, item.collection, item_id)
            away = Exclusion.of(
                texts, await warm(self.migration.encoder_for(target)).embed_texts(list(texts)), target.vector_key
            )
            if mark:
                mark("encode")
            try:
                return await off_loop(
                    self.in_collection, target, vector, page, filters, exclude=item_id, away=away, mark=mark
                )
            except GenerationMoved:
                if attempt == SWAP_RETRIES:
                    raise
        raise AssertionError("unreachable")

    def vector(
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
        `mark(stage)` is called after the vector search and after the row fetch. Blocking."""
        page.check()
        return self.in_collection(self.resolver.resolve(name, kind), vector, page, filters, exclude=exclude, mark=mark)

    def in_collection(
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
        """`vector` in a collection `resolve` returned (the async searches resolve before embedding). Blocking."""
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

    def _by_stored_vector(
        self, item_id: int, page: PageRequest, filters: SearchFilters | None = None, *, mark: StageMark | None = None
    ) -> SearchPage:
        """`similar` without excluded texts: no model call at all. Blocking."""
        item = self.catalog.get(item_id)
        target, vector = self.migration.stored_vector(item.collection, item_id)
        if mark:
            mark("encode")  # a stored vector: no model call
        return self.in_collection(target, vector, page, filters, exclude=item_id, mark=mark)
