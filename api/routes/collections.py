"""Collections and adding to them: images (multipart upload) and texts (JSON). The rules (names,
model, kind, the cap) are the collection service's (indexer/service/collections.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Path, UploadFile

from api.deps import (
    CollectionsDep,
    MetricsDep,
    ReadAccess,
    SettingsDep,
    WriteAccess,
    run_blocking,
)
from api.guarded_route import GuardedRoute
from api.schemas import (
    MAX_QUERY_CHARS,
    MAX_TAGS,
    AddedItem,
    AddedItems,
    AddTextsRequest,
    CollectionOut,
    CreateCollectionRequest,
    Deleted,
    MigrationOut,
)
from api.uploads import inspect_image, parse_string_list, read_upload
from indexer.domain.names import COLLECTION_NAME_PATTERN
from indexer.domain.records import CollectionInfo, NewText
from indexer.service.collections import CollectionService
from retrieval.errors import InvalidInput
from retrieval.relevance import suggested_min_scores

router = APIRouter(prefix="/v1/collections", tags=["collections"], route_class=GuardedRoute)

Name = Annotated[str, Path(pattern=COLLECTION_NAME_PATTERN, description="Collection name (case-insensitive).")]


def _collection_out(info: CollectionInfo, default: bool, migrating: tuple[str, int] | None = None) -> CollectionOut:
    migration = None
    if migrating is not None:
        to_model, covered = migrating
        migration = MigrationOut(
            to_model=to_model, covered=covered, coverage=covered / info.items if info.items else 1.0
        )
    return CollectionOut(
        name=info.name,
        kind=info.kind,
        items=info.items,
        vectors=info.vectors,
        model=info.model,
        dim=info.dim,
        index=info.index,
        default=default,
        created_at=info.created_at,
        suggested_min_score=dict(suggested_min_scores(info.model)),
        migration=migration,
        degraded=info.degraded,
        ocr=info.ocr,
    )


def _listed(service: CollectionService) -> list[CollectionOut]:
    migrating = service.migration.in_progress()
    return [_collection_out(info, default, migrating.get(info.id)) for info, default in service.list_all()]


def _one(service: CollectionService, name: str) -> CollectionOut:
    info = service.get(name)
    return next(out for out in _listed(service) if out.name == info.name)


@router.get("", response_model=list[CollectionOut], dependencies=[ReadAccess])
async def list_collections(collections: CollectionsDep) -> list[CollectionOut]:
    """Every collection, with its kind, item count and whether searches use it by default."""
    return await run_blocking(_listed, collections)


@router.post("", response_model=CollectionOut, status_code=201, dependencies=[WriteAccess])
async def create_collection(body: CreateCollectionRequest, collections: CollectionsDep) -> CollectionOut:
    """A new, empty collection for vectors of the server's model (409 when the name is taken,
    case-insensitively, or the catalog holds CNCLIP_MAX_COLLECTIONS already)."""
    if body.ocr and body.kind != "images":
        raise InvalidInput("ocr: only image collections have their text read")
    info = await run_blocking(collections.create, body.name, body.kind, body.index)
    if body.ocr:
        await run_blocking(collections.texts.set_ocr, info.name, True)
    return await run_blocking(_one, collections, info.name)


@router.get("/{name}", response_model=CollectionOut, dependencies=[ReadAccess])
async def get_collection(name: Name, collections: CollectionsDep) -> CollectionOut:
    return await run_blocking(_one, collections, name)


@router.delete("/{name}", response_model=Deleted, dependencies=[WriteAccess])
async def delete_collection(name: Name, collections: CollectionsDep) -> Deleted:
    """Delete a collection with all its items and vectors; `deleted` is how many items it held."""
    return Deleted(deleted=await run_blocking(collections.delete_collection, name))


@router.post("/{name}/items", response_model=AddedItem, status_code=201, dependencies=[WriteAccess])
async def add_image(
    name: Name,
    file: Annotated[UploadFile, File(description="JPEG/PNG/WebP image bytes.")],
    collections: CollectionsDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    caption: Annotated[str | None, Form(max_length=MAX_QUERY_CHARS)] = None,
    tags: Annotated[str | None, Form(description="Comma-separated (猫,室内) or a JSON list.")] = None,
) -> AddedItem:
    """Add one image (with optional caption and tags) to an image collection of the server's model."""
    target = await run_blocking(collections.resolver.writable, name, "images")  # before the upload is read; passed down
    tag_list = parse_string_list(tags, "tags", MAX_TAGS, 64) or []
    data = await read_upload(file, settings.max_image_bytes)
    header = await run_blocking(inspect_image, data, settings)  # the upload's one header read
    added = await collections.writes.add_upload(
        target, data, header, caption=(caption or "").strip() or None, tags=tag_list
    )
    metrics.items_indexed.labels(name, "images").inc(int(added.created))
    return AddedItem(id=added.id, created=added.created)


@router.post("/{name}/texts", response_model=AddedItems, status_code=201, dependencies=[WriteAccess])
async def add_texts(name: Name, body: AddTextsRequest, collections: CollectionsDep, metrics: MetricsDep) -> AddedItems:
    """Add texts (captions, tags, sentences) to a text collection, for image → text search."""
    new = [NewText(text=t.text, tags=list(t.tags)) for t in body.normalised()]
    added = await collections.writes.add_text_items(name, new)
    metrics.items_indexed.labels(name, "texts").inc(sum(a.created for a in added))
    return AddedItems(items=[AddedItem(id=a.id, created=a.created) for a in added])
