"""Saved zero-shot label sets: PUT/GET/DELETE /v1/label-sets/{name}."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from api.deps import LabelSetsDep, ReadAccess, WriteAccess, run_blocking
from api.guarded_route import GuardedRoute
from api.schemas import NAME_PATTERN, LabelSet, NamedLabelSet
from retrieval.prompts import check_prompts
from retrieval.zeroshot import DEFAULT_TEMPLATES

router = APIRouter(prefix="/v1/label-sets", tags=["label sets"], route_class=GuardedRoute)

SetName = Annotated[str, Path(pattern=NAME_PATTERN, description="Letters, digits, _ - . (at most 64).")]


@router.get("", response_model=list[NamedLabelSet], dependencies=[ReadAccess])
async def list_label_sets(store: LabelSetsDep) -> list[NamedLabelSet]:
    """Every saved set, by name."""
    data = await run_blocking(store.all_sets)
    return [NamedLabelSet(name=name, **value) for name, value in sorted(data.items())]


@router.get("/{name}", response_model=NamedLabelSet, dependencies=[ReadAccess])
async def get_label_set(name: SetName, store: LabelSetsDep) -> NamedLabelSet:
    return NamedLabelSet(name=name, **await run_blocking(store.get, name))


@router.put("/{name}", response_model=NamedLabelSet, dependencies=[WriteAccess])
async def put_label_set(name: SetName, body: LabelSet, store: LabelSetsDep, response: Response) -> NamedLabelSet:
    """Create or replace a set (201 when new, 200 when replaced)."""
    check_prompts(body.labels, body.templates or DEFAULT_TEMPLATES)  # the classify route's rule, so it can be used
    created = await run_blocking(store.put, name, body.labels, body.templates)
    response.status_code = 201 if created else 200
    return NamedLabelSet(name=name, labels=body.labels, templates=body.templates)


@router.delete("/{name}", status_code=204, dependencies=[WriteAccess])
async def delete_label_set(name: SetName, store: LabelSetsDep) -> Response:
    await run_blocking(store.delete, name)
    return Response(status_code=204)
