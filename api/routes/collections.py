"""Collections and adding to them: images (multipart upload) and texts (JSON)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Path, UploadFile

from api.deps import (
    CatalogDep,
    CollectionsDep,
    EncoderDep,
    MetricsDep,
    ReadAccess,
    SettingsDep,
    WriteAccess,
    run_blocking,
)
from api.schemas import (
    MAX_QUERY_CHARS,
    MAX_TAGS,
    NAME_PATTERN,
    AddedItem,
    AddedItems,
    AddTextsRequest,
    CollectionOut,
    CreateCollectionRequest,
)
from api.searching import CollectionDirectory
from api.uploads import inspect_image, parse_string_list, read_upload
from indexer.types import Catalog, CollectionInfo, CollectionKind, NewImage, NewText
from retrieval.errors import InvalidInput

router = APIRouter(prefix="/v1/collections", tags=["collections"])

Name = Annotated[str, Path(pattern=NAME_PATTERN, description="Collection name.")]
TEXT_BATCH = 64  # texts per encoder call when adding many


def _collection_out(info: CollectionInfo, defaults: set[int]) -> CollectionOut:
    return CollectionOut(
        name=info.name,
        kind=info.kind,
        items=info.items,
        vectors=info.vectors,
        model=info.model,
        dim=info.dim,
        index=info.index,
        default=info.id in defaults,
        created_at=info.created_at,
    )


def _list_with_defaults(catalog: Catalog) -> list[CollectionOut]:
    defaults = {c.id for c in (catalog.default_collection("images"), catalog.default_collection("texts")) if c}
    return [_collection_out(c, defaults) for c in catalog.list_collections()]


@router.get("", response_model=list[CollectionOut], dependencies=[ReadAccess])
async def list_collections(catalog: CatalogDep) -> list[CollectionOut]:
    """Every collection, with its kind, item count and whether searches use it by default."""
    return await run_blocking(_list_with_defaults, catalog)


@router.post("", response_model=CollectionOut, status_code=201, dependencies=[WriteAccess])
async def create_collection(
    body: CreateCollectionRequest, catalog: CatalogDep, encoder: EncoderDep, settings: SettingsDep
) -> CollectionOut:
    """A new, empty collection for vectors of the server's model (409 when the name is taken)."""
    index = body.index or settings.index_factory
    info = await run_blocking(catalog.create_collection, body.name, body.kind, encoder.model_id, encoder.dim, index)
    default = await run_blocking(catalog.default_collection, info.kind)
    return _collection_out(info, {default.id} if default else set())


@router.get("/{name}", response_model=CollectionOut, dependencies=[ReadAccess])
async def get_collection(name: Name, catalog: CatalogDep) -> CollectionOut:
    collections = await run_blocking(_list_with_defaults, catalog)
    found = next((c for c in collections if c.name == name), None)
    if found is None:
        await run_blocking(catalog.get_collection, name)  # raises the catalog's NotFound
        raise InvalidInput(f"collection {name!r} disappeared while reading it; retry")
    return found


async def _writable(
    directory: CollectionDirectory, catalog: Catalog, name: str, kind: CollectionKind, dim: int
) -> None:
    info = await directory.resolve(catalog, name, kind)
    if info.dim != dim:
        raise InvalidInput(f"collection {name!r} holds {info.dim}-d vectors of {info.model}; the server's are {dim}-d")


@router.post("/{name}/items", response_model=AddedItem, status_code=201, dependencies=[WriteAccess])
async def add_image(
    name: Name,
    file: Annotated[UploadFile, File(description="JPEG/PNG/WebP image bytes.")],
    catalog: CatalogDep,
    collections: CollectionsDep,
    encoder: EncoderDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    caption: Annotated[str | None, Form(max_length=MAX_QUERY_CHARS)] = None,
    tags: Annotated[str | None, Form(description="Comma-separated (猫,室内) or a JSON list.")] = None,
) -> AddedItem:
    """Add one image (with optional caption and tags) to an image collection."""
    await _writable(collections, catalog, name, "images", encoder.dim)
    tag_list = parse_string_list(tags, "tags", MAX_TAGS, 64) or []
    data = await read_upload(file, settings.max_image_bytes)
    await run_blocking(inspect_image, data, settings)
    vectors = await encoder.embed_images([data])
    new = NewImage(data=data, caption=(caption or "").strip() or None, tags=tag_list)
    [added] = await run_blocking(catalog.add_images, name, [new], vectors)
    metrics.items_indexed.labels(name, "images").inc(int(added.created))
    return AddedItem(id=added.id, created=added.created)


@router.post("/{name}/texts", response_model=AddedItems, status_code=201, dependencies=[WriteAccess])
async def add_texts(
    name: Name,
    body: AddTextsRequest,
    catalog: CatalogDep,
    collections: CollectionsDep,
    encoder: EncoderDep,
    metrics: MetricsDep,
) -> AddedItems:
    """Add texts (captions, tags, sentences) to a text collection, for image → text search."""
    await _writable(collections, catalog, name, "texts", encoder.dim)
    texts = body.normalised()
    added = []
    for start in range(0, len(texts), TEXT_BATCH):
        chunk = texts[start : start + TEXT_BATCH]
        vectors = await encoder.embed_texts([t.text for t in chunk])
        new = [NewText(text=t.text, tags=list(t.tags)) for t in chunk]
        added += await run_blocking(catalog.add_texts, name, new, vectors)
    metrics.items_indexed.labels(name, "texts").inc(sum(a.created for a in added))
    return AddedItems(items=[AddedItem(id=a.id, created=a.created) for a in added])
