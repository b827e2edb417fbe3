"""JSON from outside (request bodies, manifests, model and tuning files, files left on disk) parsed with
one rule more than `json.loads`: a document nested deeper than Python's recursion limit is a
`json.JSONDecodeError` like any other malformed text. `json.loads` raises `RecursionError` there,
which no caller's `except JSONDecodeError` catches: a 500 from the API, a traceback from the CLI —
for a body of a few kilobytes of `[`."""

from __future__ import annotations

import json
from typing import Any


class JSONTooDeep(json.JSONDecodeError):
    """The document nests arrays/objects deeper than the parser can follow."""


def loads(text: str | bytes | bytearray) -> Any:
    """`json.loads(text)`; a document nested too deeply raises `JSONTooDeep` (a `JSONDecodeError`)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise JSONTooDeep("nested too deeply", "", 0) from None
