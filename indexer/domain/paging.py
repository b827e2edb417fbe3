"""How a relevance cutoff, an order and paging combine with a vector search (used by the service).

A vector engine answers "the n nearest items"; people looking for photos want "the relevant ones,
newest first, a page at a time". The rule, the same for text, image and similar-item searches:

1. Candidates: the engine's nearest `n` items that pass the filters (tags, mime, dates are applied
   inside the engine, so they never thin out a page). `n` is `offset + k + 1` for the plain case
   (relevance order, no cutoff), so the next page is known to exist; otherwise the whole candidate
   pool, `MAX_CANDIDATES` (an order by date is only meaningful among a fixed set of results).
2. Cutoff: candidates scoring below `min_score` are dropped; `below_cutoff` counts them (what the UI
   says it hid: in a collection smaller than the pool, every item that is not a result).
3. Order: `relevance` (score, best first), `taken` (when the photo was taken, newest first; undated
   last) or `added` (when it was indexed, newest first); ties by score.
4. Page: `offset` .. `offset + k` of that list. A list ends at `MAX_CANDIDATES`: a page reaching
   past it is cut short (never an error, so that any offset and k within their bounds is valid).

`total` is how many results passed the cutoff among the candidates. It is exact (`total_exact`)
when the engine ran out of items before the pool was full, or when the pool's last candidate was
already below the cutoff (scores only fall from there); otherwise more items pass than the pool
holds and `total` is a lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from indexer.domain.records import Hit
from retrieval.errors import InvalidInput

SortOrder = Literal["relevance", "taken", "added"]
SORT_ORDERS: tuple[SortOrder, ...] = ("relevance", "taken", "added")
MAX_CANDIDATES = 1000  # the deepest a result list goes
MAX_PAGE = 200  # the most results one page holds (the API's and the CLI's `k`)


@dataclass(frozen=True)
class PageRequest:
    """One page of a search: `k` results from `offset`, above `min_score`, in `sort` order."""

    k: int = 20
    offset: int = 0
    min_score: float | None = None
    sort: SortOrder = "relevance"

    def check(self) -> None:
        """`InvalidInput` for a page no search can give (the API validates first; the CLI relies on this)."""
        if not 1 <= self.k <= MAX_CANDIDATES:
            raise InvalidInput(f"k must be 1 to {MAX_CANDIDATES}, not {self.k}")
        if not 0 <= self.offset < MAX_CANDIDATES:
            raise InvalidInput(f"offset must be 0 to {MAX_CANDIDATES - 1} (result lists end there), not {self.offset}")
        if self.min_score is not None and not -1.0 <= self.min_score <= 1.0:
            raise InvalidInput(f"min_score is a cosine similarity, -1 to 1, not {self.min_score}")
        if self.sort not in SORT_ORDERS:
            raise InvalidInput(f"sort is one of {', '.join(SORT_ORDERS)}, not {self.sort!r}")

    @property
    def plain(self) -> bool:
        """Relevance order without a cutoff: no need to look past the page."""
        return self.sort == "relevance" and self.min_score is None

    def candidates(self) -> int:
        """How many nearest items to ask the engine for."""
        return min(self.end + 1, MAX_CANDIDATES) if self.plain else MAX_CANDIDATES

    @property
    def end(self) -> int:
        """Where this page ends in the result list."""
        return min(self.offset + self.k, MAX_CANDIDATES)


@dataclass(frozen=True)
class Ranked:
    """The ids of one page, and what is known about the whole result list."""

    ids: list[Hit]
    total: int
    total_exact: bool
    has_more: bool
    below_cutoff: int


DateKeys = dict[int, tuple[datetime | None, datetime | None]]  # id -> (taken_at, created_at)


def rank(hits: list[Hit], pool: int, page: PageRequest, dates: DateKeys | None = None) -> Ranked:
    """Apply the cutoff, the order and the page to `hits` (best first, at most `pool` of them:
    the engine's answer); `dates` are needed for the date orders."""
    cutoff = page.min_score
    above = hits if cutoff is None else [h for h in hits if h.score >= cutoff]
    below = len(hits) - len(above)
    if page.sort != "relevance":
        keys = dates or {}
        slot = 0 if page.sort == "taken" else 1

        def newest_first(hit: Hit) -> tuple[bool, float, float]:
            moment = keys.get(hit.id, (None, None))[slot]
            when = moment.replace(tzinfo=UTC).timestamp() if moment else 0.0  # SQL's naive UTC
            return (moment is None, -when, -hit.score)

        above = sorted(above, key=newest_first)
    exhausted = len(hits) < pool or (cutoff is not None and bool(hits) and hits[-1].score < cutoff)
    end = page.end
    return Ranked(
        ids=above[page.offset : end],
        total=len(above),
        total_exact=exhausted,
        has_more=len(above) > end,
        below_cutoff=below,
    )
