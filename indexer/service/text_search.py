"""A text search that reads the text in photos too (issue 32): the blocking part of `search_text` in
mode `text` or `hybrid` (indexer/service/search_cases.py embeds the query first, off the event loop).

- `clip`: the vector search alone, the query as typed (the use case never comes here).
- `text`: the items whose recognised text holds the query's words (normal form,
  indexer/domain/text_grams.py) and every quoted part, best covered first
  (indexer/storage/sql/text_search.py); `score` is that coverage, 0..1, and `min_score` cuts on it.
- `hybrid` (the default on a collection with OCR on): the CLIP ranking of the unquoted words and the
  text ranking of the same words, merged by reciprocal-rank fusion (indexer/domain/text_query.py);
  `score` stays the cosine. Quoted parts are a hard filter on both lists: the CLIP list is then the
  cosines of the items holding them (their stored vectors, exact), not the engine's nearest. An item
  the text matched passes `min_score` whatever its cosine (its text is the evidence), the others
  need the cosine. Excluded texts push the CLIP list as in a plain search. A query of quoted parts
  only is ranked by the text.

The filters are the same on both lists (tags, mime, dates), the order (`sort`) and page follow
indexer/domain/paging.py over the merged list, which ends at MAX_CANDIDATES like any result list;
`total_exact` is false when either list was cut at its depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from indexer.domain.exclusion import Exclusion, pushed_away, rescored
from indexer.domain.paging import MAX_CANDIDATES, PageRequest, rank
from indexer.domain.records import CollectionState, Hit, SearchFilters
from indexer.domain.results import Found, SearchPage, StageMark
from indexer.domain.text_query import RRF_K, MatchedSpan, SearchMode, SplitQuery, TextMatches, fuse, locate
from indexer.service.ports import Catalog
from retrieval.errors import InvalidInput


def default_mode(target: CollectionState) -> SearchMode:
    """`hybrid` where text is recognised (the collection's `ocr`), `clip` elsewhere."""
    return "hybrid" if target.ocr else "clip"


def check_exclusions(mode: SearchMode, excluded: Sequence[str], clip_text: str) -> None:
    """Excluded texts push the CLIP ranking away from them: a `text` search, or one of quoted parts
    only, has none to push (a 422 rather than an exclusion silently ignored)."""
    if excluded and (mode == "text" or not clip_text):
        raise InvalidInput("exclude pushes CLIP results away: a text search (or quoted parts only) has none")


class HybridSearch:
    """Text and hybrid searches over the catalog's ports (the vectors and the recognised texts)."""

    def __init__(self, catalog: Catalog, rrf_k: int = RRF_K) -> None:
        self.catalog = catalog
        self.rrf_k = rrf_k

    def page(
        self,
        target: CollectionState,
        query: SplitQuery,
        mode: SearchMode,
        vector: np.ndarray | None,
        page: PageRequest,
        filters: SearchFilters | None = None,
        *,
        away: Exclusion | None = None,
        mark: StageMark | None = None,
    ) -> SearchPage:
        """One page of a `text` or `hybrid` search of `target` (resolved); `vector` is the unquoted
        words' embedding (None in mode text, or when every word is quoted)."""
        if mode == "clip":
            raise ValueError("a clip search is the service's search_in")
        required, ranked = query.required, query.ranked
        if not required and not ranked:
            raise InvalidInput("the query has no text to look for (only quotes and spaces)")
        texts = self.catalog.texts
        # The text list: the unquoted words within the quoted parts, or the quoted parts alone.
        text_list = texts.search_texts(target, [ranked, *required] if ranked else required, filters, MAX_CANDIDATES)
        matched = {m.item_id for m in text_list.matches}
        if mode == "text" or vector is None:
            hits = [Hit(m.item_id, m.coverage) for m in text_list.matches]
            if mark:
                mark("search")
            coverage = {h.id: h.score for h in hits}
            return self._paged(target, hits, coverage, page, text_list.complete, matched, query, mode, mark)
        allowed = texts.search_texts(target, required, filters, MAX_CANDIDATES) if required else None
        clip, exact = self._clip_list(target, vector, page, filters, allowed, away)
        if mark:
            mark("search")
        # Text matches outside the CLIP list still show their cosine (stored vectors, exact).
        known = {h.id for h in clip}
        cosines = {h.id: h.score for h in clip}
        outside = [m.item_id for m in text_list.matches if m.item_id not in known]
        cosines.update({h.id: h.score for h in self._cosines(target, vector, outside)})
        passing = [h for h in clip if page.min_score is None or h.score >= page.min_score or h.id in matched]
        fused = fuse([[h.id for h in passing], [m.item_id for m in text_list.matches]], self.rrf_k)
        order = [Hit(i, score) for i, score in fused]
        complete = exact and text_list.complete and (allowed is None or allowed.complete)
        if allowed is not None:  # every item of the CLIP list holds the quoted parts: show where
            matched |= {m.item_id for m in allowed.matches}
        below = len(clip) - len(passing)
        return self._paged(target, order, cosines, page, complete, matched, query, mode, mark, below=below)

    # --- the CLIP list ---------------------------------------------------------------------------
    def _clip_list(
        self,
        target: CollectionState,
        vector: np.ndarray,
        page: PageRequest,
        filters: SearchFilters | None,
        allowed: TextMatches | None,
        away: Exclusion | None,
    ) -> tuple[list[Hit], bool]:
        """(the CLIP ranking, best first, at most MAX_CANDIDATES; whether it holds every item it could)."""
        if allowed is None:
            hits = self.catalog.search(target.name, vector, MAX_CANDIDATES, filters, vector_key=target.vector_key)
            return pushed_away(self.catalog, target, hits, MAX_CANDIDATES, page, away)
        hits = self._cosines(target, vector, [m.item_id for m in allowed.matches])
        if away is not None:
            hits = rescored(self.catalog, target, hits, away)
        return hits, allowed.complete

    def _cosines(self, target: CollectionState, vector: np.ndarray, ids: Sequence[int]) -> list[Hit]:
        """`ids` by their stored vectors' cosine with `vector`, best first (ties by id)."""
        if not ids:
            return []
        stored = self.catalog.vectors_for(target.name, ids, target.vector_key)
        scores = np.asarray(stored, dtype=np.float32) @ np.asarray(vector, dtype=np.float32)
        hits = [Hit(int(i), float(s)) for i, s in zip(ids, scores, strict=True)]
        return sorted(hits, key=lambda h: (-h.score, h.id))

    # --- the page --------------------------------------------------------------------------------
    def _paged(
        self,
        target: CollectionState,
        order: list[Hit],
        scores: dict[int, float],
        page: PageRequest,
        complete: bool,
        matched: set[int],
        query: SplitQuery,
        mode: SearchMode,
        mark: StageMark | None,
        *,
        below: int | None = None,
    ) -> SearchPage:
        """Cutoff, date order and page over `order` (best first); results show their `scores` and where
        the query is in their text. `below`: how many the caller's cutoff left out already (hybrid: the
        CLIP list's); None: cut here, on `scores` (the text's coverage)."""
        if below is None:
            cutoff = page.min_score
            kept = [h for h in order if cutoff is None or scores[h.id] >= cutoff]
            below = len(order) - len(kept)
        else:
            kept = order
        exact = complete and len(kept) <= MAX_CANDIDATES
        kept = kept[:MAX_CANDIDATES]
        dates = self.catalog.sort_keys([h.id for h in kept]) if page.sort != "relevance" else None
        ranked = rank(kept, len(kept) + 1, replace(page, min_score=None), dates)
        ids = [h.id for h in ranked.ids]
        records = {r.id: r for r in self.catalog.get_many(ids)}
        spans = self._spans([i for i in ids if i in matched], query)
        if mark:
            mark("db")
        results = [Found(scores[i], records[i], spans.get(i)) for i in ids if i in records and i in scores]
        return SearchPage(target, results, page, ranked.total, exact, ranked.has_more, below, mode)

    def _spans(self, ids: Sequence[int], query: SplitQuery) -> dict[int, MatchedSpan]:
        """Where the query's words (else its first quoted part it holds) are in each item's recognised text."""
        pieces = [p for p in [query.ranked, *query.required] if p]
        spans: dict[int, MatchedSpan] = {}
        for item_id, text in (self.catalog.texts.texts_for(ids) if ids else {}).items():
            found = next((s for s in (locate(text.text, p) for p in pieces) if s is not None), None)
            if found is not None:
                spans[item_id] = found
        return spans
