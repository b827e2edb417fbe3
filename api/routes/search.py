"""Text → image and image → image / image → text search."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, UploadFile

from api.deps import CatalogDep, CollectionsDep, EncoderDep, MetricsDep, ReadAccess, SettingsDep, run_blocking
from api.schemas import MAX_K, NAME_PATTERN, SearchResponse, TextSearchRequest
from api.searching import StageTimer, resolve_collection, search_by_vector, to_search_filters
from api.uploads import inspect_image, read_upload

router = APIRouter(prefix="/v1/search", tags=["search"], dependencies=[ReadAccess])


@router.post("/text", response_model=SearchResponse)
async def search_text(
    body: TextSearchRequest,
    encoder: EncoderDep,
    catalog: CatalogDep,
    collections: CollectionsDep,
    metrics: MetricsDep,
) -> SearchResponse:
    """Images (of `collection`, default: the default image collection) that match a text."""
    timer = StageTimer()
    info = await resolve_collection(collections, catalog, body.collection, "images", encoder)
    vector = (await encoder.embed_texts([body.query]))[0]
    timer.mark("encode")
    results = await search_by_vector(catalog, info.name, vector, body.k, to_search_filters(body.filters), timer)
    timings = timer.finish()
    metrics.observe_stages("search_text", timings)
    return SearchResponse(results=results, collection=info.name, timings=timings)


@router.post("/image", response_model=SearchResponse)
async def search_image(
    file: Annotated[UploadFile, File(description="JPEG/PNG/WebP image bytes.")],
    encoder: EncoderDep,
    catalog: CatalogDep,
    collections: CollectionsDep,
    metrics: MetricsDep,
    settings: SettingsDep,
    k: Annotated[int, Form(ge=1, le=MAX_K)] = 20,
    collection: Annotated[str | None, Form(pattern=NAME_PATTERN)] = None,
    target: Annotated[
        Literal["images", "texts"], Form(description="images: similar images; texts: captions.")
    ] = "images",
) -> SearchResponse:
    """Similar images (target=images) or best-matching texts (target=texts) for an uploaded image."""
    timer = StageTimer()
    data = await read_upload(file, settings.max_image_bytes)
    await run_blocking(inspect_image, data, settings)
    timer.mark("read")
    info = await resolve_collection(collections, catalog, collection or None, target, encoder)
    vector = (await encoder.embed_images([data]))[0]
    timer.mark("encode")
    results = await search_by_vector(catalog, info.name, vector, k, None, timer)
    timings = timer.finish()
    metrics.observe_stages(f"search_image_{target}", timings)
    return SearchResponse(results=results, collection=info.name, timings=timings)
