"""Queries that exclude: "海边的日落" but not "人". Results are ranked by the query and pushed away
from each excluded text, the same rule for text, image and similar-item searches.

The rule (chosen by measuring on the demo gallery, numbers in docs/api.md and
tests/indexer/service/test_search_exclude_demo.py): the candidates are the query's nearest `MAX_CANDIDATES` items that pass
the filters — always that many, whatever the page, so every page of one search cuts the same list.
Over those candidates, let s(x) = cos(query, x) and, per excluded text j, e_j(x) = cos(text_j, x).
Then

    score(x) = s(x) − λ · sd(s) · max_j max(0, z_j(x) − c),   z_j(x) = (e_j(x) − mean(e_j)) / sd(e_j)

with mean and sd over the candidates, λ = `PENALTY_WEIGHT` (4) and c = `PENALTY_MARGIN` (1). An item is
pushed down only when it matches an excluded text clearly more than the candidates do on average (more
than one standard deviation), by an amount in units of the query's own score spread: so one λ fits a
text query (text–image cosines) and an image query (image–image cosines, a wider spread) alike, and any
model's scale. An item that does not match an excluded text keeps its cosine exactly.

`score` in the response is this score (the cosine minus the penalty, at least -1); `min_score` cuts it,
and the date orders order the results above it. The penalised list is exact within the candidates: the
item vectors are read from SQL (the generation that answers), never approximated by the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from indexer.domain.paging import PageRequest, rank
from indexer.domain.records import CollectionState, Hit
from indexer.domain.values import text_problem
from indexer.errors import GenerationMoved
from retrieval.errors import InvalidInput

MAX_EXCLUDED = 8  # excluded texts per search
MAX_EXCLUDED_CHARS = 512  # each, as a query (api/schemas.py MAX_QUERY_CHARS; a test keeps them equal)
PENALTY_WEIGHT = 4.0  # λ
PENALTY_MARGIN = 1.0  # c: standard deviations above the candidates' mean before a penalty starts


def excluded_texts(texts: Sequence[str] | None) -> tuple[str, ...]:
    """The excluded texts of a search, stripped, each once (in their order): `InvalidInput` for more
    than `MAX_EXCLUDED`, a blank or over-long one, or one breaking the text rule (NUL, a lone
    surrogate: indexer/domain/values.py). The API validates the same before (422); the CLI relies on this."""
    if not texts:
        return ()
    if isinstance(texts, str):
        raise InvalidInput("exclude is a list of texts, not one text")
    if len(texts) > MAX_EXCLUDED:
        raise InvalidInput(f"exclude holds at most {MAX_EXCLUDED} texts, not {len(texts)}")
    kept: dict[str, None] = {}
    for text in texts:
        if not isinstance(text, str):
            raise InvalidInput("every excluded text must be a string")
        problem = text_problem(text)
        if problem is not None:
            raise InvalidInput(f"an excluded text {problem}")
        stripped = text.strip()
        if not stripped:
            raise InvalidInput("an excluded text is empty")
        if len(stripped) > MAX_EXCLUDED_CHARS:
            raise InvalidInput(f"an excluded text holds at most {MAX_EXCLUDED_CHARS} characters, not {len(stripped)}")
        kept[stripped] = None
    return tuple(kept)


@dataclass(frozen=True)
class Exclusion:
    """Excluded texts and their unit vectors, embedded for the model generation `vector_key` names."""

    texts: tuple[str, ...]
    vectors: np.ndarray  # (len(texts), dim) float32
    vector_key: str

    @classmethod
    def of(cls, texts: Sequence[str], vectors: np.ndarray, vector_key: str) -> Exclusion:
        matrix = np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        return cls(tuple(texts), matrix / np.where(norms > 0, norms, 1.0), vector_key)


def penalties(scores: np.ndarray, excluded: np.ndarray) -> np.ndarray:
    """The penalty of each candidate: `scores` (n,) its cosine to the query, `excluded` (n, m) its
    cosines to the excluded texts (the rule in this module's docstring). Zero for fewer than two
    candidates, and for an excluded text every candidate matches equally (no spread to judge by)."""
    scores = np.asarray(scores, dtype=np.float64)
    excluded = np.asarray(excluded, dtype=np.float64).reshape(len(scores), -1)
    if len(scores) < 2 or excluded.shape[1] == 0:
        return np.zeros(len(scores))
    spread = excluded.std(axis=0)
    z = np.where(spread > 1e-9, (excluded - excluded.mean(axis=0)) / np.where(spread > 1e-9, spread, 1.0), 0.0)
    over = np.maximum(0.0, z - PENALTY_MARGIN).max(axis=1)
    return PENALTY_WEIGHT * float(scores.std()) * over


def push_away(hits: Sequence[Hit], vectors: np.ndarray, exclusion: Exclusion) -> list[Hit]:
    """`hits` (the candidates, best first) re-scored by the rule and re-ordered best first (ties keep
    the engine's order); `vectors` are the candidates' stored vectors in the same order (a zero row for
    one deleted meanwhile: dropped later with its row)."""
    if not hits:
        return []
    matrix = np.asarray(vectors, dtype=np.float32).reshape(len(hits), -1)
    if matrix.shape[1] == 0:  # no candidate has a vector any more (all deleted meanwhile)
        matrix = np.zeros((len(hits), exclusion.vectors.shape[1]), dtype=np.float32)
    if matrix.shape[1] != exclusion.vectors.shape[1]:
        raise InvalidInput(
            f"the excluded texts were embedded as {exclusion.vectors.shape[1]}-d vectors, "
            f"the collection holds {matrix.shape[1]}-d ones"
        )
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    units = matrix / np.where(norms > 0, norms, 1.0)
    scores = np.array([h.score for h in hits], dtype=np.float64)
    penalised = scores - penalties(scores, units @ exclusion.vectors.T)
    order = np.argsort(-penalised, kind="stable")
    return [Hit(hits[i].id, max(-1.0, float(penalised[i]))) for i in order]


class StoredVectors(Protocol):
    """Where the candidates' stored vectors come from (the catalog's `ItemStore`, indexer/service/ports.py)."""

    def vectors_for(self, collection: str, ids: Sequence[int], vector_key: str) -> np.ndarray: ...


def rescored(catalog: StoredVectors, target: CollectionState, hits: Sequence[Hit], away: Exclusion) -> list[Hit]:
    """`push_away` with the candidates' stored vectors of the generation that answered the search
    (`GenerationMoved` when the excluded texts were embedded for another: a swap meanwhile)."""
    if away.vector_key != target.vector_key:
        raise GenerationMoved(f"collection {target.name!r} swapped its model generation; embed again")
    return push_away(hits, catalog.vectors_for(target.name, [h.id for h in hits], target.vector_key), away)


def pushed_away(
    catalog: StoredVectors,
    target: CollectionState,
    hits: list[Hit],
    pool: int,
    page: PageRequest,
    away: Exclusion | None,
) -> tuple[list[Hit], bool]:
    """(the candidates, re-scored when there are excluded texts; whether the page's `total` is exact). Exactness is
    judged by the cosines: a penalty only lowers a score, so no item past the pool can pass a cutoff its cosine fails."""
    exact = rank(hits, pool, replace(page, sort="relevance")).total_exact
    return (hits if away is None else rescored(catalog, target, hits, away)), exact
