"""How search results look to clients: urls (never server paths), file names, scores rounded,
and per-stage timings. The rules (which collection, which model, which rows) live in the
collection service (indexer/service/collections.py)."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import PurePath

from api.schemas import Filters, ItemOut, MatchedText, SearchResponse, SearchResult
from indexer.domain.records import ItemRecord, SearchFilters
from indexer.domain.results import Found, SearchPage
from indexer.domain.text_query import MatchedSpan
from indexer.fs.file_names import printable


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


def file_names(item: ItemRecord) -> tuple[str | None, str | None]:
    """(file name, path relative to the indexed folder) of a bulk-indexed file; the server's own
    absolute paths are never shown. Undecodable bytes of a name are shown as `\\xNN` (JSON is text)."""
    if not item.path:
        return None, None
    path = PurePath(item.path)
    relative = None
    if item.root:
        try:
            relative = path.relative_to(item.root).as_posix()
        except ValueError:
            relative = None
    return printable(path.name), printable(relative) if relative is not None else None


def item_out(item: ItemRecord, ocr_text: str | None = None) -> ItemOut:
    """The item as clients see it; `ocr_text`: the text recognised in it, when it was read."""
    image_url, thumbnail_url = image_urls(item)
    filename, relative = file_names(item)
    return ItemOut(
        id=item.id,
        collection=item.collection,
        kind=item.kind,
        caption=item.caption,
        filename=filename,
        path=relative,
        tags=list(item.tags),
        mime=item.mime,
        size=item.size,
        width=item.width,
        height=item.height,
        image_url=image_url,
        thumbnail_url=thumbnail_url,
        created_at=item.created_at,
        taken_at=item.taken_at,
        taken_at_source=item.taken_source,
        ocr_text=ocr_text,
    )


def matched_out(span: MatchedSpan | None) -> MatchedText | None:
    if span is None:
        return None
    return MatchedText(text=span.text, start=span.start, end=span.end, line=span.line, line_start=span.line_start)


def result_out(found: Found) -> SearchResult:
    item = found.item
    image_url, thumbnail_url = image_urls(item)
    filename, relative = file_names(item)
    return SearchResult(
        id=item.id,
        score=round(float(found.score), 6),
        caption=item.caption,
        filename=filename,
        path=relative,
        tags=list(item.tags),
        image_url=image_url,
        thumbnail_url=thumbnail_url,
        width=item.width,
        height=item.height,
        taken_at=item.taken_at,
        taken_at_source=item.taken_source,
        matched_text=matched_out(found.match),
    )


def page_out(page: SearchPage, timings: dict[str, float]) -> SearchResponse:
    """The response for one page of results (paging rules: indexer/domain/paging.py)."""
    request = page.page
    return SearchResponse(
        results=[result_out(f) for f in page.results],
        collection=page.collection.name,
        total=page.total,
        total_exact=page.total_exact,
        offset=request.offset,
        has_more=page.has_more,
        next_offset=request.end if page.has_more else None,
        below_cutoff=page.below_cutoff,
        min_score=request.min_score,
        sort=request.sort,
        mode=page.mode,
        timings=timings,
    )


def to_search_filters(
    filters: Filters | None, taken_from: datetime | None = None, taken_to: datetime | None = None
) -> SearchFilters | None:
    """The catalog's filters for a request's (JSON body filters, or the taken_* form/query fields)."""
    if filters is None:
        if taken_from is None and taken_to is None:
            return None
        return SearchFilters(taken_from=taken_from, taken_to=taken_to)
    return SearchFilters(
        tags=filters.tags,
        mime=filters.mime,
        date_from=filters.date_from,
        date_to=filters.date_to,
        taken_from=filters.taken_from,
        taken_to=filters.taken_to,
    )
