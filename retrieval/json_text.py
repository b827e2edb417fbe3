"""JSON from outside (request bodies, manifests, model and tuning files, files left on disk) parsed with
one rule more than `json.loads`: a document nested deeper than Python's recursion limit is a
`json.JSONDecodeError` like any other malformed text. `json.loads` raises `RecursionError` there,
which no caller's `except JSONDecodeError` catches: a 500 from the API, a traceback from the CLI —
for a body of a few kilobytes of `[`.

And one rule for its numbers, applied while parsing (before a literal is converted): a number of more
than `MAX_NUMBER_CHARS` characters, one that overflows a float (`1e400`), and NaN / Infinity (not
JSON, though `json.loads` takes them) raise `JSONNumberRefused`, also a `JSONDecodeError`. Converting
100,000 digits would otherwise raise a bare `ValueError` (Python's 4300-digit limit), and a NaN would
pass every range check made with comparisons."""

from __future__ import annotations

import json
import math
from typing import Any, NoReturn

# No number a document of ours holds needs more characters (a float's repr takes at most 24).
MAX_NUMBER_CHARS = 100


class JSONTooDeep(json.JSONDecodeError):
    """The document nests arrays/objects deeper than the parser can follow."""


class DuplicateKey(json.JSONDecodeError):
    """An object names one key twice (`json.loads` would keep the last without a word)."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKey(f"the key {key[:80]!r} appears twice", "", 0)
        found[key] = value
    return found


class JSONNumberRefused(json.JSONDecodeError):
    """A number too long to convert, beyond a float's range, or NaN / Infinity."""


def _refuse(message: str) -> NoReturn:
    raise JSONNumberRefused(message, "", 0)


def _parse_int(literal: str) -> int:
    if len(literal) > MAX_NUMBER_CHARS:
        _refuse(f"holds a number of {len(literal)} digits; at most {MAX_NUMBER_CHARS} are taken")
    return int(literal)


def _parse_float(literal: str) -> float:
    if len(literal) > MAX_NUMBER_CHARS:
        _refuse(f"holds a number of {len(literal)} characters; at most {MAX_NUMBER_CHARS} are taken")
    value = float(literal)
    if not math.isfinite(value):
        _refuse(f"holds a number out of range ({literal[:20]})")
    return value


def _parse_constant(name: str) -> NoReturn:
    _refuse(f"holds {name}, which is not a JSON number")


def loads(text: str | bytes | bytearray, *, unique_keys: bool = False) -> Any:
    """`json.loads(text)`; a document nested too deeply raises `JSONTooDeep` (a `JSONDecodeError`),
    with `unique_keys` an object that repeats a key raises `DuplicateKey`, and a number the rule above
    refuses raises `JSONNumberRefused` (both `JSONDecodeError`s too)."""
    try:
        return json.loads(
            text,
            object_pairs_hook=_unique if unique_keys else None,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except RecursionError:
        raise JSONTooDeep("nested too deeply", "", 0) from None
