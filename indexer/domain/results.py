"""What the collection service hands out besides the catalog's records: a page of search results,
a line of statistics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from indexer.domain.paging import PageRequest
from indexer.domain.records import CollectionInfo, CollectionState, ItemRecord
from indexer.domain.text_query import MatchedSpan, SearchMode

StageMark = Callable[[str], None]  # called with a stage's name when it ends (the API's per-stage timings)


@dataclass(frozen=True)
class Found:
    score: float
    item: ItemRecord
    match: MatchedSpan | None = None  # where the query is in the item's recognised text (issue 32)


@dataclass(frozen=True)
class SearchPage:
    """One page of results and what is known of the whole list (indexer/domain/paging.py)."""

    collection: CollectionState
    results: list[Found]
    page: PageRequest
    total: int  # results above the cutoff among the candidates
    total_exact: bool  # False: more pass than the candidate pool holds (`total` is a lower bound)
    has_more: bool
    below_cutoff: int  # how many candidates fell below min_score
    mode: SearchMode = "clip"  # how a text query was answered (indexer/service/text_search.py)


@dataclass(frozen=True)
class CollectionStats:
    """One line of `cnclip stats`."""

    info: CollectionInfo
    vectors: int | None  # None: the engine could not be asked now (`vectors_unavailable` says why)
    vectors_unavailable: str | None
    deleted: int  # deletions remembered
