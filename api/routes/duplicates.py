"""Near-duplicate groups of an image collection, to review (the rules: indexer/service/duplicates.py through
the collection service). Deleting a member is DELETE /v1/items/{id}: remembered, like any deletion."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import CollectionsDep, ReadAccess, run_blocking
from api.duplicate_schemas import TIER_DOC, DuplicatesResponse, duplicates_out
from api.guarded_route import GuardedRoute
from api.routes.collections import Name
from api.searching import StageTimer
from indexer.domain.duplicate_pages import MAX_LIMIT, MAX_OFFSET, TierChoice

router = APIRouter(prefix="/v1/collections", tags=["collections"], route_class=GuardedRoute)


@router.get("/{name}/duplicates", response_model=DuplicatesResponse, dependencies=[ReadAccess])
async def list_duplicates(
    name: Name,
    collections: CollectionsDep,
    tier: Annotated[TierChoice, Query(description=TIER_DOC)] = "all",
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Groups per page.")] = 20,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Groups to skip (paging).")] = 0,
) -> DuplicatesResponse:
    """Groups of near-duplicate photos in three tiers (identical bytes, the same picture re-encoded or
    resized, similar shots), each with a suggested keeper first and every member's score against it.
    Large collections answer within CNCLIP_DUPLICATE_TIME_BUDGET_S with what was found so far
    (`complete` false); ask again to go on."""
    timer = StageTimer()
    await collections.duplicates.calibrate(name)  # measured once per model and collection size
    page = await run_blocking(collections.duplicates.page, name, tier, offset, limit)
    return duplicates_out(page, timer.finish())
