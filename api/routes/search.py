"""Text → image and image → image / image → text search."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, UploadFile

from api.deps import CollectionsDep, MetricsDep, ReadAccess, SettingsDep, run_blocking
from api.guarded_route import GuardedRoute
from api.schemas import (
    EXCLUDE_DOC,
    MAX_K,
    MAX_OFFSET,
    MIN_SCORE_DOC,
    OFFSET_DOC,
    SORT_DOC,
    Query,
    SearchResponse,
    TextSearchRequest,
)
from api.searching import StageTimer, page_out, to_search_filters
from api.uploads import inspect_image, read_upload
from indexer.domain.exclusion import MAX_EXCLUDED
from indexer.domain.names import COLLECTION_NAME_PATTERN
from indexer.domain.paging import PageRequest, SortOrder

router = APIRouter(prefix="/v1/search", tags=["search"], dependencies=[ReadAccess], route_class=GuardedRoute)


@router.post("/text", response_model=SearchResponse)
async def search_text(body: TextSearchRequest, collections: CollectionsDep, metrics: MetricsDep) -> SearchResponse:
    """Images (of `collection`, default: the default image collection) that match a text: by CLIP, by the
    text recognised in them, or both (`mode`)."""
    timer = StageTimer()
    page = PageRequest(body.k, body.offset, body.min_score, body.sort)
    filters = to_search_filters(body.filters)
    found = await collections.search.text(
        body.query, body.collection, page, filters, excluded=body.exclude, mode=body.mode, mark=timer.mark
    )
    timings = timer.finish()
    metrics.observe_stages("search_text", timings)
    return page_out(found, timings)


@router.post("/image", response_model=SearchResponse)
async def search_image(
    file: Annotated[UploadFile, File(description="JPEG/PNG/WebP image bytes.")],
    collections: CollectionsDep,
    metrics: MetricsDep,
    settings: SettingsDep,
    k: Annotated[int, Form(ge=1, le=MAX_K)] = 20,
    collection: Annotated[str | None, Form(pattern=COLLECTION_NAME_PATTERN)] = None,
    target: Annotated[
        Literal["images", "texts"], Form(description="images: similar images; texts: captions.")
    ] = "images",
    offset: Annotated[int, Form(ge=0, le=MAX_OFFSET, description=OFFSET_DOC)] = 0,
    min_score: Annotated[float | None, Form(ge=-1.0, le=1.0, description=MIN_SCORE_DOC)] = None,
    sort: Annotated[SortOrder, Form(description=SORT_DOC)] = "relevance",
    taken_from: Annotated[datetime | None, Form(description="Taken at or after (ISO 8601).")] = None,
    taken_to: Annotated[datetime | None, Form(description="Taken at or before (ISO 8601).")] = None,
    exclude: Annotated[list[Query] | None, Form(max_length=MAX_EXCLUDED, description=EXCLUDE_DOC)] = None,
) -> SearchResponse:
    """Similar images (target=images) or best-matching texts (target=texts) for an uploaded image;
    `exclude` (a repeated form field) pushes results away from texts."""
    timer = StageTimer()
    page = PageRequest(k, offset, min_score, sort)
    page.check()  # before the upload is read
    data = await read_upload(file, settings.max_image_bytes)
    await run_blocking(inspect_image, data, settings)
    timer.mark("read")
    filters = to_search_filters(None, taken_from, taken_to)
    found = await collections.search.image(
        data, collection or None, target, page, filters, excluded=exclude or (), mark=timer.mark
    )
    timings = timer.finish()
    metrics.observe_stages(f"search_image_{target}", timings)
    return page_out(found, timings)
