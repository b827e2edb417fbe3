"""Items by id: metadata, the image, its thumbnail, similar images, delete.

Media are served only by item id: the file path comes from the catalog, never from the client, and
the collection service reads the bytes served (`indexer.storage.media.check.read_media`): once, from a descriptor reached without
leaving the indexed folder, checked against the recorded sha256. A file that changed is 410, one
missing or out of its folder 404; never other bytes, never a response cut short.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from api.deps import CollectionsDep, MetricsDep, ReadAccess, WriteAccess, run_blocking
from api.guarded_route import GuardedRoute
from api.media_response import media_response
from api.schemas import (
    EXCLUDE_DOC,
    MAX_K,
    MAX_OFFSET,
    MIN_SCORE_DOC,
    OFFSET_DOC,
    SORT_DOC,
    Deleted,
    ItemId,
    ItemOut,
    SearchResponse,
)
from api.schemas import Query as QueryText
from api.searching import StageTimer, item_out, page_out, to_search_filters
from indexer.domain.exclusion import MAX_EXCLUDED
from indexer.domain.paging import PageRequest, SortOrder
from indexer.domain.renditions import jpeg_rendition

router = APIRouter(prefix="/v1/items", tags=["items"], route_class=GuardedRoute)

_MEDIA_CACHE = {"Cache-Control": "private, max-age=86400"}
_FORMAT_DOC = (
    "`original` (default): the bytes as indexed, to download. `jpeg`: a JPEG of at most 2048 px on its longest "
    "side, EXIF-oriented, for browsers that cannot show the original (HEIC, TIFF, camera RAW)."
)


@router.get("/{item_id}", response_model=ItemOut, dependencies=[ReadAccess])
async def get_item(item_id: ItemId, collections: CollectionsDep) -> ItemOut:
    item = await run_blocking(collections.item, item_id)
    return item_out(item, await run_blocking(collections.texts.recognised, item_id))


@router.get("/{item_id}/image", response_class=Response, dependencies=[ReadAccess])
async def get_image(
    item_id: ItemId,
    collections: CollectionsDep,
    request: Request,
    format: Annotated[Literal["original", "jpeg"], Query(description=_FORMAT_DOC)] = "original",  # noqa: A002
) -> Response:
    """The original image bytes, while they are still the bytes that were indexed (410 once changed).
    Single byte ranges are served (206); the ETag is the content's sha256. `format=jpeg`: a JPEG
    rendition for browsers that cannot show the original (HEIC, TIFF, camera RAW)."""
    item, data = await run_blocking(collections.media, item_id)
    if format == "jpeg":
        jpeg = await run_blocking(jpeg_rendition, data, collections.max_image_pixels)
        return media_response(request, jpeg, f"{item.sha256 or ''}-jpeg", "image/jpeg", _MEDIA_CACHE)
    media_type = item.mime or "application/octet-stream"
    return media_response(request, data, item.sha256 or "", media_type, _MEDIA_CACHE)


@router.get("/{item_id}/thumbnail", response_class=Response, dependencies=[ReadAccess])
async def get_thumbnail(item_id: ItemId, collections: CollectionsDep) -> Response:
    """A JPEG at most 320 px on its longest side, made on first request from the verified indexed
    bytes and cached by content (the source is checked like the image's)."""
    jpeg = await run_blocking(collections.thumbnail, item_id)
    return Response(jpeg, media_type="image/jpeg", headers=_MEDIA_CACHE)


@router.get("/{item_id}/similar", response_model=SearchResponse, dependencies=[ReadAccess])
async def similar_items(
    item_id: ItemId,
    collections: CollectionsDep,
    metrics: MetricsDep,
    k: Annotated[int, Query(ge=1, le=MAX_K)] = 12,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description=OFFSET_DOC)] = 0,
    min_score: Annotated[float | None, Query(ge=-1.0, le=1.0, description=MIN_SCORE_DOC)] = None,
    sort: Annotated[SortOrder, Query(description=SORT_DOC)] = "relevance",
    taken_from: Annotated[datetime | None, Query(description="Taken at or after (ISO 8601).")] = None,
    taken_to: Annotated[datetime | None, Query(description="Taken at or before (ISO 8601).")] = None,
    exclude: Annotated[list[QueryText] | None, Query(max_length=MAX_EXCLUDED, description=EXCLUDE_DOC)] = None,
) -> SearchResponse:
    """Items of the same collection nearest to this one (itself left out), by its stored vector;
    `exclude` (repeated: `?exclude=人&exclude=车`) pushes results away from texts."""
    timer = StageTimer()
    page = PageRequest(k, offset, min_score, sort)
    filters = to_search_filters(None, taken_from, taken_to)
    found = await collections.search.similar(item_id, page, filters, excluded=exclude or (), mark=timer.mark)
    timings = timer.finish()
    metrics.observe_stages("similar", timings)
    return page_out(found, timings)


@router.delete("/{item_id}", response_model=Deleted, dependencies=[WriteAccess])
async def delete_item(item_id: ItemId, collections: CollectionsDep) -> Deleted:
    """Delete an item. The deletion is remembered: `cnclip index` of its folder does not add the same
    bytes again (unless run with `--restore-deleted`)."""
    await run_blocking(collections.item, item_id)  # 404 for an unknown id
    return Deleted(deleted=await run_blocking(collections.delete_items, [item_id]))
