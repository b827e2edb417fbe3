"""The values a request carries, one rule per kind, checked where they enter (the route class runs
`check_arguments` on every argument FastAPI takes from a request; the form fields that hold JSON and
the KServe v2 tensors call the same rules):

- **text** (`text_problem`, the catalog's rule in indexer/domain/values.py): no NUL and no lone surrogate,
  anywhere. PostgreSQL cannot store NUL in text and nothing can encode a lone surrogate as UTF-8 (the
  database drivers, JSON responses), so such a text is refused as 422 naming its field, on every
  database alike — never stored on one and a 500 on the other.
- **datetime** (`datetime_problem`, on the catalog's `as_utc`): in range (years 1..9999) once
  normalised to UTC. An offset can push `0001-01-01T00:00:30+23:59` or `9999-12-31T23:59:59-23:59` out
  of the calendar, which only fails where the value is converted (`OverflowError` in the SQL layer). A
  naive datetime is UTC.
- **number** (`number_problem`, `ascii_count`, `numbers_within`): bounded before it is converted.
  Floats must be finite; counts in headers are ASCII digits (Python's `int` also takes `٣` and
  refuses `²`, which `str.isdigit` accepts) and short enough to convert; a list of tensor values is
  checked against its range before numpy converts it (numpy raises `OverflowError` on 2**70).
  JSON's own numbers are bounded by the parser (`retrieval/json_text.py`).

`json_safe` makes any text fit into a JSON error message (a lone surrogate is written as `\\udXXX`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from starlette.datastructures import UploadFile

from indexer.domain.values import FLAWED_TEXT, as_utc, text_problem
from retrieval.errors import InvalidInput

# Digits in a count a header carries (byte lengths, ranges): 10**18 bytes is beyond any body or file.
MAX_COUNT_DIGITS = 18
_MAX_DEPTH = 32  # request values are validated models: deeper means something is wrong with the walk


def datetime_problem(moment: datetime) -> str | None:
    """Why `moment` cannot be taken (out of range once normalised to UTC: `as_utc`, the catalog's one
    datetime rule), or None when it can. A naive datetime is UTC."""
    if as_utc(moment) is None:
        return f"{moment.isoformat()} is out of range once normalised to UTC (years 1 to 9999)"
    return None


def number_problem(number: float) -> str | None:
    """Why a parsed number cannot be taken (NaN, infinite), or None when it can."""
    if isinstance(number, float) and not math.isfinite(number):
        return f"{number} is not a finite number"
    return None


def ascii_count(text: str, max_digits: int = MAX_COUNT_DIGITS) -> int | None:
    """A non-negative count written in ASCII digits (as HTTP writes lengths and ranges); None when
    `text` is not one. A count of more than `max_digits` digits is not converted: it is returned as
    10**max_digits, larger than anything it could count."""
    if not text or not text.isascii() or not text.isdigit():
        return None
    return int(text) if len(text) <= max_digits else 10**max_digits


def numbers_within(values: list[Any], low: float, high: float) -> bool:
    """Whether every value is a number (int or float) in [low, high], decided before any conversion:
    Python compares ints of any size with floats exactly, so 2**70 or 10**400 is just out of range.
    NaN may pass (comparisons with it are false): check finiteness after converting."""
    if not values:
        return True
    try:
        return bool(low <= min(values) and max(values) <= high)
    except TypeError:  # a string, null, object or list among the numbers
        return False


def json_safe(text: str) -> str:
    """`text` with every lone surrogate written as an escape, so that it can be encoded as UTF-8 JSON."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _problem(value: Any) -> str | None:
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, datetime):
        return datetime_problem(value)
    if isinstance(value, float):
        return number_problem(value)
    return None


def _children(value: Any) -> Iterable[tuple[str, Any]]:
    """(name, value) of what a request value holds: a model's fields, a list's items, a dict's keys and
    values, an upload's file name."""
    if isinstance(value, BaseModel):
        return ((name, getattr(value, name)) for name in type(value).model_fields)
    if isinstance(value, list | tuple | set | frozenset):
        return ((str(i), item) for i, item in enumerate(value))
    if isinstance(value, Mapping):  # a key is text too: checked under its own name, then its value
        return ((str(key), part) for key, item in value.items() for part in (key, item))
    if isinstance(value, UploadFile):
        return [("filename", value.filename)]
    return ()


def value_problems(value: Any, where: str, depth: int = 0) -> Iterable[str]:
    """`where: why` for every text, datetime and number inside `value` that breaks its rule."""
    problem = _problem(value)
    if problem is not None:
        yield f"{where}: {json_safe(problem)}"
        return
    if depth >= _MAX_DEPTH:
        return
    for name, child in _children(value):
        yield from value_problems(child, f"{where}.{name}" if where else name, depth + 1)


def _clean(value: Any, depth: int = 0) -> bool:
    """True when nothing inside `value` breaks a rule: the quick pass every request takes (the largest
    legal body, 51,000 texts and tags, in about 15 ms); only a value that fails it is walked again for
    the name of what failed."""
    if isinstance(value, str):
        return FLAWED_TEXT.search(value) is None
    if isinstance(value, list | tuple) and depth < _MAX_DEPTH:
        return all(_clean(item, depth + 1) for item in value)
    if isinstance(value, BaseModel) and depth < _MAX_DEPTH:
        return all(_clean(item, depth + 1) for item in value.__dict__.values())
    if isinstance(value, datetime | float | Mapping | set | frozenset | UploadFile):
        return next(iter(value_problems(value, "")), None) is None
    return True


def check_value(value: Any, where: str) -> None:
    """Raise `InvalidInput` (422) naming the first part of `value` that breaks a rule above."""
    if _clean(value):
        return
    for problem in value_problems(value, where):
        raise InvalidInput(problem)


def check_arguments(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Check the arguments a route received from its request: `sources` maps each argument's name to
    where it came from (query, path, header, cookie, body); other arguments (dependencies) are not
    looked at. Names follow pydantic's error locations: `query.k`, a form field's own name, a JSON
    body's fields without `body.` (`filters.date_to`)."""
    for name, source in sources.items():
        if name not in values:
            continue
        value = values[name]
        if source != "body":
            check_value(value, f"{source}.{name}")
        else:
            check_value(value, "" if isinstance(value, BaseModel) else name)
