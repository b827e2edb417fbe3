"""Small conversions every SQL module of the catalog shares: timestamps (naive UTC in both
databases), id lists cut to the drivers' limits, the sha256 of a text."""

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
