"""How a search query meets the text recognised in photos (issue 32): pure rules, used by the hybrid
search (indexer/service/text_search.py).

- A query splits into the words CLIP reads and quoted parts: `"会议室" 白板` is CLIP text `白板` and a
  hard filter, every result's recognised text holds 会议室. Straight and curly double quotes and
  corner brackets (「」, as Chinese writes quotations) quote; an unclosed quote runs to the end.
- Two rankings (CLIP's and the text's) merge by reciprocal-rank fusion: an item's fused score is
  the sum of 1 / (RRF_K + rank) over the lists it is in. An item both lists hold beats one only a
  list holds at the same rank; when the text matches nothing, the CLIP order is unchanged. RRF_K
  was measured on the rendered signs of tests/system/test_ocr_search.py (docs/api.md, Text in photos).
- A match is shown as a span of the recognised text as read (not its normal form), with the line
  it starts in, so a client can highlight the words under the thumbnail.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from indexer.domain.text_grams import normalize_text

SearchMode = Literal["clip", "text", "hybrid"]
SEARCH_MODES: tuple[SearchMode, ...] = ("clip", "text", "hybrid")
RRF_K = 10
_QUOTED = re.compile(r'"([^"]*)(?:"|$)|“([^”]*)(?:”|$)|「([^」]*)(?:」|$)')


@dataclass(frozen=True)
class SplitQuery:
    """A query's words for CLIP (whitespace collapsed; may be empty) and its quoted parts (non-empty)."""

    clip_text: str
    quoted: tuple[str, ...]

    @property
    def required(self) -> list[str]:
        """The quoted parts in normal form, each once, in query order (what a result's text must hold)."""
        pieces = [normalize_text(q) for q in self.quoted]
        return list(dict.fromkeys(p for p in pieces if p))

    @property
    def ranked(self) -> str:
        """The unquoted words in normal form: the text search's ranked piece ("" when none)."""
        return normalize_text(self.clip_text)


def split_query(query: str) -> SplitQuery:
    """`query`'s CLIP words and quoted parts (see the module docstring)."""
    quoted = tuple(q.strip() for m in _QUOTED.finditer(query) for q in m.groups() if q is not None and q.strip())
    rest = _QUOTED.sub(" ", query)
    return SplitQuery(" ".join(rest.split()), quoted)


def fuse(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """(item id, fused score), best first, over every id in `rankings` (each best first). Ties keep
    the order of the first list that holds the ids, then of the next."""
    scores: dict[int, float] = {}
    first_seen: dict[int, tuple[int, int]] = {}
    for which, ranking in enumerate(rankings):
        for position, item_id in enumerate(ranking):
            scores[item_id] = scores.get(item_id, 0.0) + 1.0 / (k + position + 1)
            first_seen.setdefault(item_id, (which, position))
    return sorted(scores.items(), key=lambda pair: (-pair[1], first_seen[pair[0]]))


@dataclass(frozen=True)
class MatchedSpan:
    """Where a searched piece is in an item's recognised text: `text[start:end]` of the whole text as
    read (lines joined by "\\n"; offsets count Unicode code points), and the line the match starts in,
    which begins at `line_start` of the whole text."""

    text: str
    start: int
    end: int
    line: str
    line_start: int


def locate(text: str, piece: str) -> MatchedSpan | None:
    """The first place the normal-form `piece` occurs in `text` (as read), or None. The normal form
    drops whitespace and folds characters one by one, so each character of the normal form maps back
    to the character of `text` it came from."""
    if not piece:
        return None
    folded: list[str] = []
    origin: list[int] = []
    for index, char in enumerate(text):
        for out in normalize_text(char):
            folded.append(out)
            origin.append(index)
    at = "".join(folded).find(piece)
    if at < 0:
        return None
    start, end = origin[at], origin[at + len(piece) - 1] + 1
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", start)
    line = text[line_start : line_end if line_end >= 0 else len(text)]
    return MatchedSpan(text[start:end], start, end, line, line_start)


@dataclass(frozen=True)
class TextMatch:
    """An item whose normal-form text holds the searched piece: how often, and how much of it."""

    item_id: int
    occurrences: int
    coverage: float  # occurrences × piece length / text length, 0..1


@dataclass(frozen=True)
class TextMatches:
    """The best `limit` matches, best first; `complete` when no other item matches."""

    matches: list[TextMatch]
    complete: bool
