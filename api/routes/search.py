"""Text → image and image → image / image → text search."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, UploadFile

from api.deps import CollectionsDep, EncoderDep, MetricsDep, ReadAccess, SettingsDep, run_blocking
from api.schemas import MAX_K, SearchResponse, TextSearchRequest
from api.searching import StageTimer, result_out, to_search_filters
from api.uploads import inspect_image, read_upload
from indexer.names import COLLECTION_NAME_PATTERN

router = APIRouter(prefix="/v1/search", tags=["search"], dependencies=[ReadAccess])


@router.post("/text", response_model=SearchResponse)
async def search_text(
    body: TextSearchRequest, encoder: EncoderDep, collections: CollectionsDep, metrics: MetricsDep
) -> SearchResponse:
    """Images (of `collection`, default: the default image collection) that match a text."""
    timer = StageTimer()
    await run_blocking(collections.resolve, body.collection, "images")  # before any model work
    vector = (await encoder.embed_texts([body.query]))[0]
    timer.mark("encode")
    filters = to_search_filters(body.filters)
    info, found = await run_blocking(
        collections.search, body.collection, "images", vector, body.k, filters, mark=timer.mark
    )
    timings = timer.finish()
    metrics.observe_stages("search_text", timings)
    return SearchResponse(results=[result_out(f) for f in found], collection=info.name, timings=timings)


@router.post("/image", response_model=SearchResponse)
async def search_image(
    file: Annotated[UploadFile, File(description="JPEG/PNG/WebP image bytes.")],
    encoder: EncoderDep,
    collections: CollectionsDep,
    metrics: MetricsDep,
    settings: SettingsDep,
    k: Annotated[int, Form(ge=1, le=MAX_K)] = 20,
    collection: Annotated[str | None, Form(pattern=COLLECTION_NAME_PATTERN)] = None,
    target: Annotated[
        Literal["images", "texts"], Form(description="images: similar images; texts: captions.")
    ] = "images",
) -> SearchResponse:
    """Similar images (target=images) or best-matching texts (target=texts) for an uploaded image."""
    timer = StageTimer()
    data = await read_upload(file, settings.max_image_bytes)
    await run_blocking(inspect_image, data, settings)
    timer.mark("read")
    await run_blocking(collections.resolve, collection or None, target)
    vector = (await encoder.embed_images([data]))[0]
    timer.mark("encode")
    info, found = await run_blocking(collections.search, collection or None, target, vector, k, mark=timer.mark)
    timings = timer.finish()
    metrics.observe_stages(f"search_image_{target}", timings)
    return SearchResponse(results=[result_out(f) for f in found], collection=info.name, timings=timings)
