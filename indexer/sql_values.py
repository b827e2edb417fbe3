"""Small conversions every SQL module of the catalog shares: timestamps (naive UTC in both
databases), id lists cut to the drivers' limits, the sha256 of a text, vector blobs to a matrix."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

IN_CHUNK = 5000  # ids per SQL IN (...) list; SQLite allows 32766 variables


def naive_utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def aware(moment: datetime | None) -> datetime | None:
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


def chunks(values: Sequence[Any] | np.ndarray, size: int = IN_CHUNK) -> Iterable[list[Any]]:
    """Slices for IN (...) lists; numpy ints become Python ints for the drivers."""
    for start in range(0, len(values), size):
        yield [v.item() if isinstance(v, np.generic) else v for v in values[start : start + size]]


def text_sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def vector_matrix(ids: np.ndarray | Sequence[int], blobs: dict[int, bytes], dim: int | None = None) -> np.ndarray:
    """The float32 vectors of `ids` in that order, from `blobs` (item id -> stored bytes); a zero row
    for an id without one (deleted meanwhile: callers drop it). `dim` None: taken from the blobs."""
    if dim is None:
        dim = len(next(iter(blobs.values()))) // 4 if blobs else 0
    matrix = np.zeros((len(ids), dim), dtype=np.float32)
    for row, item_id in enumerate(ids):
        blob = blobs.get(int(item_id))
        if blob is not None:
            matrix[row] = np.frombuffer(blob, dtype=np.float32)
    return matrix
