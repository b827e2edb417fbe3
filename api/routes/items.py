"""Items by id: metadata, the image, its thumbnail, similar images, delete.

Media are served only by item id: the file path comes from the catalog, never from the client.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse

from api.deps import CatalogDep, EncoderDep, MetricsDep, ReadAccess, WriteAccess, run_blocking
from api.schemas import MAX_K, Deleted, ItemOut, SearchResponse
from api.searching import StageTimer, item_out, search_by_vector
from api.thumbnails import ensure_thumbnail, thumbnail_path
from indexer.types import ItemRecord
from retrieval.errors import NotFound

router = APIRouter(prefix="/v1/items", tags=["items"])

_MEDIA_CACHE = {"Cache-Control": "private, max-age=86400"}


async def _image_item(catalog: CatalogDep, item_id: int) -> ItemRecord:
    item = await run_blocking(catalog.get, item_id)
    if item.kind != "images":
        raise NotFound(f"item {item_id} is a text; it has no image")
    return item


@router.get("/{item_id}", response_model=ItemOut, dependencies=[ReadAccess])
async def get_item(item_id: int, catalog: CatalogDep) -> ItemOut:
    return item_out(await run_blocking(catalog.get, item_id))


@router.get("/{item_id}/image", response_class=FileResponse, dependencies=[ReadAccess])
async def get_image(item_id: int, catalog: CatalogDep) -> FileResponse:
    """The original image bytes."""
    item = await _image_item(catalog, item_id)
    path = await run_blocking(catalog.media_path, item_id)
    if not await run_blocking(path.is_file):
        raise NotFound(f"the image file of item {item_id} is missing")
    return FileResponse(path, media_type=item.mime or "application/octet-stream", headers=_MEDIA_CACHE)


@router.get("/{item_id}/thumbnail", response_class=FileResponse, dependencies=[ReadAccess])
async def get_thumbnail(item_id: int, catalog: CatalogDep, request: Request) -> FileResponse:
    """A JPEG at most 320 px on its longest side, made on first request and cached."""
    item = await _image_item(catalog, item_id)
    source = await run_blocking(catalog.media_path, item_id)
    target = thumbnail_path(request.app.state.thumbs_dir, item)
    path = await run_blocking(ensure_thumbnail, source, target, request.app.state.settings.max_image_pixels)
    return FileResponse(path, media_type="image/jpeg", headers=_MEDIA_CACHE)


@router.get("/{item_id}/similar", response_model=SearchResponse, dependencies=[ReadAccess])
async def similar_items(
    item_id: int,
    catalog: CatalogDep,
    encoder: EncoderDep,
    metrics: MetricsDep,
    k: Annotated[int, Query(ge=1, le=MAX_K)] = 12,
) -> SearchResponse:
    """Items of the same collection nearest to this one (itself left out), by its stored vector."""
    timer = StageTimer()
    item = await run_blocking(catalog.get, item_id)
    vector = await run_blocking(catalog.vector, item_id)
    timer.mark("encode")  # a stored vector: no model call
    results = await search_by_vector(catalog, item.collection, vector, k, None, timer, exclude=item_id)
    timings = timer.finish()
    metrics.observe_stages("similar", timings)
    return SearchResponse(results=results, collection=item.collection, timings=timings)


@router.delete("/{item_id}", response_model=Deleted, dependencies=[WriteAccess])
async def delete_item(item_id: int, catalog: CatalogDep, request: Request) -> Deleted:
    item = await run_blocking(catalog.get, item_id)
    deleted = await run_blocking(catalog.delete, [item_id])
    if item.kind == "images":
        await run_blocking(thumbnail_path(request.app.state.thumbs_dir, item).unlink, missing_ok=True)
    return Deleted(deleted=deleted)
