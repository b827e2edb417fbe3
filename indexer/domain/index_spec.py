"""Index descriptions: a small grammar of exactly the indexes the project builds, parsed before any
engine sees the text.

A collection's index is described by a FAISS-style string (`Flat`, `HNSW32`, `IVF1024,Flat`,
`IVF1024,PQ64`, `Auto`), stored in SQL and shared by both engines (FAISS and Milvus map the same record).
FAISS's own factory is never handed a user's string: several malformed ones (`PQ8x0`, `IVF8,RQ1x0`,
`RR0,Flat`, `HNSW0`) kill the process inside native code, so validating by trying is not safe.
Instead the text is parsed here against the grammar below, with bounds on every number, into an
`IndexSpec`; FAISS only ever builds `spec.description`, the string re-rendered from that record.

    Flat
    HNSW[M][,Flat]            M links per node, 2..512 (bare HNSW is HNSW32, like FAISS)
    IVF<n>,Flat               n inverted lists, 1..65536
    IVF<n>,PQ<m>[x<bits>]     m sub-vectors dividing the dimension, bits 1..8 (default 8)
    Auto                      Flat while small, then IVF<≈4√n>,Flat re-trained as n grows 4× (`auto_target`)

Numbers are ASCII digits without leading zeros (so each index has one spelling); no spaces, no
other tokens. Anything else is an `InvalidIndexDescription` naming the allowed forms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from retrieval.errors import InvalidInput

MAX_DESCRIPTION_CHARS = 64  # the longest valid description is 18 characters (IVF65536,PQ32768x8)
MAX_LISTS = 65_536  # Milvus's bound for nlist; FAISS trains 64 points a list, so 4M vectors to train the most
LINKS_RANGE = (2, 512)  # HNSW0 / HNSW1 abort inside FAISS; past 512 a vector's links outweigh a 512-d vector 8x
DEFAULT_LINKS = 32  # what FAISS and Milvus make of a bare `HNSW`
BITS_RANGE = (1, 8)  # PQ code bits per sub-vector: PQ…x0 is a division by zero inside FAISS
DEFAULT_BITS = 8
TRAIN_POINTS_PER_LIST = 39  # FAISS warns when an IVF list's k-means gets fewer training points
ALLOWED_FORMS = (
    "Flat, HNSW{M} (M 2 to 512, e.g. HNSW32), IVF{n},Flat (n 1 to 65536, e.g. IVF1024,Flat) "
    "IVF{n},PQ{m}[x{bits}] (m divides the vector dimension, bits 1 to 8, e.g. IVF1024,PQ64) "
    "or Auto (Flat while small, then IVF{about 4 sqrt(n)},Flat)"
)
AUTO_LISTS_PER_ROOT = 4  # Auto's IVF has ≈ 4·√n lists (FAISS's guideline is 4–16·√n; the fewest trains fastest)

IndexKind = Literal["flat", "hnsw", "ivf_flat", "ivf_pq", "auto"]

# `[0-9]`, not `\d`: `\d` matches every script's digits (Arabic-Indic `١٠`), and int() would take them.
_NUMBER = r"0|[1-9][0-9]*"
_FORMS: tuple[tuple[IndexKind, re.Pattern[str]], ...] = (
    ("flat", re.compile(r"Flat")),
    ("auto", re.compile(r"Auto")),
    ("hnsw", re.compile(rf"HNSW(?P<links>{_NUMBER})?(?:,Flat)?")),
    ("ivf_flat", re.compile(rf"IVF(?P<lists>{_NUMBER}),Flat")),
    ("ivf_pq", re.compile(rf"IVF(?P<lists>{_NUMBER}),PQ(?P<parts>{_NUMBER})(?:x(?P<bits>{_NUMBER}))?")),
)


class InvalidIndexDescription(InvalidInput):
    """An index description outside the grammar or its bounds (a 422, like any invalid input)."""


@dataclass(frozen=True)
class IndexSpec:
    """A parsed index description: what FAISS builds and what the Milvus plan maps."""

    kind: IndexKind
    links: int = 0  # HNSW: links per node (M)
    lists: int = 0  # IVF: inverted lists (nlist)
    parts: int = 0  # PQ: sub-vectors per vector (m)
    bits: int = 0  # PQ: bits of each sub-vector's code

    @property
    def description(self) -> str:
        """The one spelling of this index: stored in SQL and the only string FAISS's factory sees."""
        if self.kind == "hnsw":
            return f"HNSW{self.links}"
        if self.kind == "ivf_flat":
            return f"IVF{self.lists},Flat"
        if self.kind == "ivf_pq":
            bits = "" if self.bits == DEFAULT_BITS else f"x{self.bits}"
            return f"IVF{self.lists},PQ{self.parts}{bits}"
        if self.kind == "auto":
            return "Auto"
        return "Flat"

    @property
    def needs_training(self) -> bool:
        """Whether the index replaces Flat only once the collection has enough vectors."""
        return self.kind != "flat"

    @property
    def training_points(self) -> int:
        """The fewest vectors that train every trained part of this index, and so the fewest a
        collection needs before it replaces Flat (0: nothing to train). The one place that knows what
        each part of the grammar trains: IVF's coarse k-means wants `TRAIN_POINTS_PER_LIST` points per
        list (FAISS warns below), and each PQ codebook is a k-means of 2^bits centroids, which FAISS
        refuses to train on fewer points ("Number of training points (70) should be at least as large
        as number of clusters (256)"). HNSW builds by insertion: nothing to train."""
        needed = 0
        if self.kind in ("ivf_flat", "ivf_pq"):
            needed = max(needed, TRAIN_POINTS_PER_LIST * self.lists)
        if self.kind == "ivf_pq":
            needed = max(needed, 2**self.bits)
        return needed

    @property
    def exact_scores(self) -> bool:
        """Whether its scores are exact inner products (full vectors) or need a re-rank (PQ codes)."""
        return self.kind != "ivf_pq"


FLAT = IndexSpec("flat")
AUTO = IndexSpec("auto")


def auto_lists(count: int) -> int:
    """The IVF lists `Auto` trains for `count` vectors: ≈ 4·√n, and never more than the vectors can
    train (`TRAIN_POINTS_PER_LIST` each) or Milvus allows. Not rounded to a power of two, so a
    trained index's lists tell the count it was trained for ((lists / 4)²): the re-training rule
    below needs no other record in the saved file."""
    wanted = round(AUTO_LISTS_PER_ROOT * count**0.5)
    return max(1, min(wanted, count // TRAIN_POINTS_PER_LIST, MAX_LISTS))


def auto_target(count: int, active: IndexSpec, flat_up_to: int) -> IndexSpec | None:
    """What an `Auto` collection of `count` vectors should be trained as now, when it is `active`;
    None to keep what it has. Flat up to `flat_up_to` vectors (`CNCLIP_INDEX_AUTO_IVF_MIN`, measured:
    docs/indexing.md), then `IVF{auto_lists(n)},Flat`, trained again each time the collection has
    grown 4× (its lists would double), so each IVF list keeps ≈ √n/4 vectors and a search's cost
    grows with √n, not n."""
    if count < flat_up_to or active.kind not in ("flat", "ivf_flat"):
        return None
    lists = auto_lists(count)
    if active.kind == "ivf_flat" and lists < 2 * active.lists:
        return None
    return IndexSpec("ivf_flat", lists=lists)


def parse_index(text: object, dim: int | None = None) -> IndexSpec:
    """The `IndexSpec` of a description; `InvalidIndexDescription` for anything outside the grammar
    or its bounds. `dim` (the collection's vector size, when known) is checked against PQ's `m`."""
    if not isinstance(text, str) or not text:
        raise InvalidIndexDescription(f"an index description is one of {ALLOWED_FORMS}")
    if len(text) > MAX_DESCRIPTION_CHARS:
        raise InvalidIndexDescription(
            f"an index description is at most {MAX_DESCRIPTION_CHARS} characters: one of {ALLOWED_FORMS}"
        )
    for kind, pattern in _FORMS:
        match = pattern.fullmatch(text)
        if match is not None:
            numbers = {name: int(value) for name, value in match.groupdict().items() if value is not None}
            return _checked(kind, numbers, dim)
    raise InvalidIndexDescription(f"unsupported index {_shown(text)}: use {ALLOWED_FORMS}")


def _checked(kind: IndexKind, numbers: dict[str, int], dim: int | None) -> IndexSpec:
    if kind == "hnsw":
        links = numbers.get("links", DEFAULT_LINKS)
        _within("HNSW needs", links, LINKS_RANGE, "links per node")
        return IndexSpec("hnsw", links=links)
    if kind == "flat":
        return FLAT
    if kind == "auto":
        return AUTO
    lists = numbers["lists"]
    _within("IVF needs", lists, (1, MAX_LISTS), "lists")
    if kind == "ivf_flat":
        return IndexSpec("ivf_flat", lists=lists)
    parts, bits = numbers["parts"], numbers.get("bits", DEFAULT_BITS)
    _within("PQ needs", bits, BITS_RANGE, "bits per code")
    if parts < 1 or (dim is not None and (parts > dim or dim % parts)):
        where = f"the dimension {dim}" if dim is not None else "the vector dimension"
        raise InvalidIndexDescription(f"PQ{parts} needs a number of sub-vectors (at least 1) that divides {where}")
    return IndexSpec("ivf_pq", lists=lists, parts=parts, bits=bits)


def _within(what: str, value: int, bounds: tuple[int, int], unit: str) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise InvalidIndexDescription(f"{what} {low} to {high} {unit}, not {value}")


def _shown(text: str) -> str:
    """The description as the message quotes it: escaped (no control characters reach a log line)."""
    return ascii(text[:40]) + ("…" if len(text) > 40 else "")
