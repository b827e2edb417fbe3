"""Small conversions every SQL module of the catalog shares: timestamps (naive UTC in both
databases), id lists cut to the drivers' limits, the sha256 of a text, vector blobs to a matrix; and
the rules for what a text or timestamp column can hold on both databases (`text_problem`, `as_utc`)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

IN_CHUNK = 5000  # ids per SQL IN (...) list; SQLite allows 32766 variables


# What `text_problem` refuses, found in one scan: a Python str holds an astral character as one code
# point, so any code point in U+D800..U+DFFF is a lone surrogate.
FLAWED_TEXT = re.compile("[\x00\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored (NUL, a lone surrogate), or None when it can: the one text rule.
    PostgreSQL cannot store NUL in text and no driver can encode a lone surrogate as UTF-8, so such a
    text is refused before it reaches SQL (or a JSON answer), on every database alike: the API answers
    422 naming the field (api/values.py), `cnclip index-texts` and a manifest name the line."""
    flaw = FLAWED_TEXT.search(text)
    if flaw is None:
        return None
    if flaw[0] == "\x00":
        return f"contains a NUL character (at {flaw.start()}); text must not hold U+0000"
    return f"contains a lone surrogate U+{ord(flaw[0]):04X} (at {flaw.start()}); text must be valid Unicode"


def as_utc(moment: datetime) -> datetime | None:
    """`moment` normalised to aware UTC (a naive one is UTC already); None when that leaves the calendar
    (years 1 to 9999): an offset pushes `0001-01-01T00:00:30+23:59` out of it. The one datetime rule:
    the API refuses such a value (api/values.py), a file's EXIF date is then no date (indexer/domain/taken.py)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        return None


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
