"""Pure translations for the Milvus engine: index description -> Milvus index, filters -> expression.

No pymilvus import here, so these rules are checked without a Milvus (and `validate` costs nothing).

Index mapping (the same descriptions as FAISS, parsed by indexer/index_spec.py into one record, so
one collection can move between engines): `Flat` -> FLAT, `IVF{n},Flat` -> IVF_FLAT(nlist=n), `HNSW{M}` / `HNSW{M},Flat` -> HNSW(M,
efConstruction=128), `IVF{n},PQ{m}[x{bits}]` -> IVF_PQ(nlist=n, m, nbits=bits, 8 by default). Milvus Lite 3.2 cannot build
IVF_PQ (its index factory raises NotImplementedError in a background build and silently keeps
searching unindexed segments by brute force), so on Lite `IVF{n},PQ{m}` becomes IVF_SQ8(nlist=n):
the compressed IVF that Lite does build. We map instead of refusing because the description is a
property of the collection in SQL: a collection made against a Milvus server must stay openable
by a Lite box (tests, one machine) and the other way round. Compressed indexes are re-ranked
exactly from SQL's vectors, so scores stay cosines either way.

Filters are expressions with `{placeholders}` and a parameter dict (Milvus `filter_params`), so a
user's tag or mime never becomes expression text on a Milvus server. Milvus Lite 3.2 ignores
template values, so for Lite only, `inline` renders each parameter as a literal with exactly the
escapes Lite's tokenizer reads (`\\`, `"`, newline, CR, tab): the value can end no string early.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from indexer.index_spec import parse_index
from indexer.types import SearchFilters
from indexer.vector_index import SearchTuning
from retrieval.errors import InvalidInput

MAX_DIM = 32_768  # Milvus's bound for FLOAT_VECTOR dim
EF_CONSTRUCTION = 128  # between FAISS's 40 (fast, lower recall) and Milvus's 200 (slow builds at 1M)
MAX_TOPK = 16_384  # Milvus refuses a larger limit
EPOCH = datetime(1970, 1, 1)
# taken_at of an item with no known date: Milvus Lite's nullable scalars do not compare like SQL's
# NULL, so an unknown date is a value far before any photo, kept out of every taken filter explicitly.
NO_TAKEN = -(2**62)


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


def plan_index(factory: str, dim: int, lite: bool) -> IndexPlan:
    """The Milvus index for a description of indexer/index_spec.py's grammar; `InvalidInput` for
    anything else (the grammar's bounds are within Milvus's: nlist <= 65536, 2 <= M <= 2048)."""
    if not 1 <= dim <= MAX_DIM:
        raise InvalidInput(f"Milvus holds vectors of 1 to {MAX_DIM} dimensions, not {dim}")
    spec = parse_index(factory, dim)
    if spec.kind == "ivf_flat":
        return IndexPlan("IVF_FLAT", {"nlist": spec.lists})
    if spec.kind == "hnsw":
        return IndexPlan("HNSW", {"M": spec.links, "efConstruction": EF_CONSTRUCTION})
    if spec.kind == "ivf_pq":
        if lite:  # see the module docstring: Lite cannot build IVF_PQ
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
        parts.append("mime in {mime}")
        params["mime"] = sorted(set(filters.mime))
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


_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def literal(value: Any) -> str:
    """A Milvus Lite expression literal for an int, a str or a list of them."""
    if isinstance(value, bool) or not isinstance(value, int | str | list):
        raise TypeError(f"no Milvus literal for {type(value).__name__}")
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, str):
        return '"' + value.translate(_ESCAPES) + '"'
    return "[" + ", ".join(literal(item) for item in value) + "]"


def inline(expression: str, params: dict[str, Any]) -> str:
    """The expression with each `{name}` replaced by its parameter as a literal (Milvus Lite only)."""
    return re.sub(r"\{(\w+)\}", lambda match: literal(params[match.group(1)]), expression)
