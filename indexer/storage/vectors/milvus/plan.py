"""Pure translations for the Milvus engine: what a Milvus supports, index description -> Milvus
index, filters -> expression, a Milvus error -> retryable or not.

No pymilvus import here, so these rules are checked without a Milvus.

What a Milvus supports is one `MilvusCapabilities` record, decided once at connect: Milvus Lite is
the `LITE` record; a server's comes from its version (`server_capabilities`). Servers from 2.3 up
are supported (`MIN_SERVER`); an older one is refused at connect with the minimum named. Nullable
fields and filter templates (`filter_params`) arrive in 2.5: the engine never stores a null (an
unknown mime is `MISSING_MIME`, an unknown taken date `NO_TAKEN`), so one collection reads and
writes the same on every version (a server upgraded from 2.3 to 2.5 keeps its collections as made).

Index mapping (the same descriptions as FAISS, parsed by indexer/domain/index_spec.py into one record, so
one collection can move between engines): `Flat` -> FLAT, `IVF{n},Flat` -> IVF_FLAT(nlist=n), `HNSW{M}` / `HNSW{M},Flat` -> HNSW(M,
efConstruction=128), `IVF{n},PQ{m}[x{bits}]` -> IVF_PQ(nlist=n, m, nbits=bits, 8 by default). Milvus Lite 3.2 cannot build
IVF_PQ (its index factory raises NotImplementedError in a background build and silently keeps
searching unindexed segments by brute force), so on Lite `IVF{n},PQ{m}` becomes IVF_SQ8(nlist=n):
the compressed IVF that Lite does build. We map instead of refusing because the description is a
property of the collection in SQL: a collection made against a Milvus server must stay openable
by a Lite box (tests, one machine) and the other way round. Compressed indexes are re-ranked
exactly from SQL's vectors, so scores stay cosines either way.
`Auto` -> IVF_FLAT(nlist=1024) (`AUTO_NLIST`): Milvus builds an index per sealed segment and
searches growing segments by brute force, so there is no Flat phase to leave and no swap to make;
one nlist sized for a sealed segment (≈ 4·√(its rows): a 512 MB segment holds ~250k 512-d vectors,
4·√250k = 2000, and FAISS's 4–16·√n rule allows the lower 1024 for smaller segments) serves every
size. Milvus's AUTOINDEX would pick for us, but Lite does not build it and what it builds differs
between versions; IVF_FLAT is built and tested on both.

Filters are expressions with `{placeholders}` and a parameter dict (Milvus `filter_params`), so a
user's tag or mime never becomes expression text on a server that takes templates (2.5 up).
Milvus Lite 3.2 ignores template values and servers before 2.5 cannot parse them, so there
`inline` renders each parameter as a literal with exactly the escapes both grammars read (`\\`,
`"`, newline, CR, tab): the value can end no string early.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from indexer.domain.index_spec import parse_index
from indexer.domain.records import SearchFilters
from indexer.storage.vectors.base import SearchTuning, VectorStoreIncompatible
from retrieval.errors import InvalidInput

MAX_DIM = 32_768  # Milvus's bound for FLOAT_VECTOR dim
EF_CONSTRUCTION = 128  # between FAISS's 40 (fast, lower recall) and Milvus's 200 (slow builds at 1M)
MAX_TOPK = 16_384  # Milvus refuses a larger limit
EPOCH = datetime(1970, 1, 1)
# taken_at of an item with no known date: Milvus Lite's nullable scalars do not compare like SQL's
# NULL, so an unknown date is a value far before any photo, kept out of every taken filter explicitly.
NO_TAKEN = -(2**62)
MISSING_MIME = ""  # mime of an item with none (a text): no filter ever asks for it, see filter_expression
NOTHING = "id < 0"  # an expression no item passes (ids are SQL primary keys, from 1)

MIN_SERVER = (2, 3, 0)  # docs/scaling-out.md's "Supported Milvus versions" says the same
TEMPLATES_SINCE = (2, 5, 0)  # filter_params and nullable fields
AUTO_NLIST = 1024  # `Auto` on Milvus: see the module docstring
SERVER_INDEXES = frozenset({"FLAT", "IVF_FLAT", "HNSW", "IVF_PQ", "IVF_SQ8"})


@dataclass(frozen=True)
class MilvusCapabilities:
    """What one Milvus (Lite, or a server of one version) supports; decided once at connect."""

    label: str  # for messages: "Milvus Lite", "Milvus server v2.3.5"
    lite: bool
    nullable_fields: bool
    filter_templates: bool
    index_types: frozenset[str]
    legacy_index_params: bool = False  # build parameters only read from the JSON `params` key (Lite 3.2)


# Lite 3.2 cannot build IVF_PQ (see above) and ignores template values.
LITE = MilvusCapabilities(
    "Milvus Lite",
    lite=True,
    nullable_fields=True,
    filter_templates=False,
    index_types=SERVER_INDEXES - {"IVF_PQ"},
    legacy_index_params=True,
)


def server_capabilities(version: str) -> MilvusCapabilities:
    """The record for a server reporting `version` (e.g. `v2.3.5`, `2.4.13-hotfix`); a server older
    than `MIN_SERVER`, or one whose version cannot be read, is `VectorStoreIncompatible`."""
    minimum = ".".join(map(str, MIN_SERVER))
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    if match is None:
        raise VectorStoreIncompatible(
            f"cannot tell the Milvus server's version from {version[:80]!r}; cnclip needs Milvus {minimum} or newer"
        )
    parsed = (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))
    if parsed < MIN_SERVER:
        raise VectorStoreIncompatible(
            f"the Milvus server is version {version[:40]}; cnclip needs Milvus {minimum} or newer (upgrade the server)"
        )
    modern = parsed >= TEMPLATES_SINCE
    return MilvusCapabilities(
        f"Milvus server {version[:40]}",
        lite=False,
        nullable_fields=modern,
        filter_templates=modern,
        index_types=SERVER_INDEXES,
    )


# A Milvus error that retrying cannot cure: the request is wrong for this version (status code
# 1100, invalid parameter, since 2.3; 2.3 reports an expression it cannot parse as 65535 with this
# text; an RPC the server lacks says unimplemented). Anything else (unreachable, timeouts, not
# loaded yet, rate limits) may pass: retryable.
_PERMANENT_CODES = frozenset({1100})
_PERMANENT_TEXT = re.compile(
    r"cannot parse expression|failed to create query plan|not supported|unsupported|unimplemented", re.I
)


def is_permanent(code: int, message: str) -> bool:
    """Whether a Milvus error is an incompatibility (never a passing outage)."""
    return code in _PERMANENT_CODES or bool(_PERMANENT_TEXT.search(message or ""))


@dataclass(frozen=True)
class IndexPlan:
    """The Milvus index a collection's description maps to, and how to search it."""

    index_type: str  # FLAT, IVF_FLAT, HNSW, IVF_PQ, IVF_SQ8
    params: dict[str, int] = field(default_factory=dict)

    @property
    def compressed(self) -> bool:
        """Scores from this index are approximate: re-rank them with the exact vectors."""
        return self.index_type in ("IVF_PQ", "IVF_SQ8")

    def search_params(self, tuning: SearchTuning, k: int) -> dict[str, Any]:
        if self.index_type == "HNSW":
            return {"metric_type": "IP", "params": {"ef": max(tuning.ef_search, k)}}  # Milvus needs ef >= k
        if self.index_type.startswith("IVF"):
            return {"metric_type": "IP", "params": {"nprobe": min(tuning.nprobe, self.params["nlist"])}}
        return {"metric_type": "IP", "params": {}}

    def exhaustive_params(self, k: int) -> dict[str, Any]:
        """Every IVF list, or a candidate list as long as HNSW allows: for a filter that few pass."""
        if self.index_type == "HNSW":
            return {"metric_type": "IP", "params": {"ef": max(MAX_TOPK, k)}}
        if self.index_type.startswith("IVF"):
            return {"metric_type": "IP", "params": {"nprobe": self.params["nlist"]}}
        return {"metric_type": "IP", "params": {}}


def plan_index(factory: str, dim: int, supports: MilvusCapabilities) -> IndexPlan:
    """The Milvus index for a description of indexer/domain/index_spec.py's grammar; `InvalidInput` for
    anything else (the grammar's bounds are within Milvus's: nlist <= 65536, 2 <= M <= 2048)."""
    if not 1 <= dim <= MAX_DIM:
        raise InvalidInput(f"Milvus holds vectors of 1 to {MAX_DIM} dimensions, not {dim}")
    spec = parse_index(factory, dim)
    if spec.kind == "auto":
        return IndexPlan("IVF_FLAT", {"nlist": AUTO_NLIST})
    if spec.kind == "ivf_flat":
        return IndexPlan("IVF_FLAT", {"nlist": spec.lists})
    if spec.kind == "hnsw":
        return IndexPlan("HNSW", {"M": spec.links, "efConstruction": EF_CONSTRUCTION})
    if spec.kind == "ivf_pq":
        if "IVF_PQ" not in supports.index_types:  # see the module docstring: Lite cannot build IVF_PQ
            return IndexPlan("IVF_SQ8", {"nlist": spec.lists})
        return IndexPlan("IVF_PQ", {"nlist": spec.lists, "m": spec.parts, "nbits": spec.bits})
    return IndexPlan("FLAT")


def micros(moment: datetime) -> int:
    """Microseconds since the epoch of a naive-UTC (SQL's convention) or aware datetime."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return (moment - EPOCH) // timedelta(microseconds=1)


def filter_expression(filters: SearchFilters | None) -> tuple[str, dict[str, Any]]:
    """(expression with placeholders, parameters) meaning the same as `ItemRows.filter_ids`;
    ("", {}) for no filter."""
    if filters is None:
        return "", {}
    parts: list[str] = []
    params: dict[str, Any] = {}
    if filters.tags:
        parts.append("array_contains_all(tags, {tags})")
        params["tags"] = sorted(set(filters.tags))
    if filters.mime:
        # The engine stores MISSING_MIME for "no mime", which SQL's NULL never matches: never ask for it.
        mimes = sorted({mime for mime in filters.mime if mime != MISSING_MIME})
        parts.append("mime in {mime}" if mimes else NOTHING)
        if mimes:
            params["mime"] = mimes
    if filters.date_from is not None:
        parts.append("created_at >= {date_from}")
        params["date_from"] = micros(filters.date_from)
    if filters.date_to is not None:
        parts.append("created_at <= {date_to}")
        params["date_to"] = micros(filters.date_to)
    if filters.taken_from is not None:
        parts.append("taken_at >= {taken_from}")
        params["taken_from"] = micros(filters.taken_from)
    if filters.taken_to is not None:
        parts.append("taken_at <= {taken_to} and taken_at > {no_taken}")
        params["taken_to"] = micros(filters.taken_to)
        params["no_taken"] = NO_TAKEN
    return " and ".join(parts), params


def filter_arguments(filters: SearchFilters | None, supports: MilvusCapabilities) -> dict[str, Any]:
    """The search keyword arguments for `filters` on this Milvus: a template and its values where
    the server takes templates, else the values inlined as escaped literals; {} for no filter."""
    expression, params = filter_expression(filters)
    if not expression:
        return {}
    if supports.filter_templates:
        return {"filter": expression, "filter_params": params}
    return {"filter": inline(expression, params)}


_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def literal(value: Any) -> str:
    """A Milvus expression literal for an int, a str or a list of them."""
    if isinstance(value, bool) or not isinstance(value, int | str | list):
        raise TypeError(f"no Milvus literal for {type(value).__name__}")
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, str):
        return '"' + value.translate(_ESCAPES) + '"'
    return "[" + ", ".join(literal(item) for item in value) + "]"


def inline(expression: str, params: dict[str, Any]) -> str:
    """The expression with each `{name}` replaced by its parameter as a literal (no templates)."""
    return re.sub(r"\{(\w+)\}", lambda match: literal(params[match.group(1)]), expression)
