"""The one rule for collection names, used by the catalog, the service, the CLI and the API schemas.

A name is 1-64 characters: ASCII letters and digits, and the letters of the common scripts (Latin
with accents, Greek, Cyrillic, kana, CJK ideographs, Hangul: `照片` is a name), then also `_`, `-`
or `.`; it starts with a letter or digit and is already in NFKC form (no look-alike compatibility
characters). The ranges are spelled out rather than written as a word class, so that the pattern
means the same to Python, to pydantic's Rust regex and to the ECMA-262 dialect of the OpenAPI
document. Names are unique case-insensitively: `collection_key` is what the database's unique
constraint holds, so `demo` and `DEMO` cannot coexist.
"""

from __future__ import annotations

import re
import unicodedata

from retrieval.errors import InvalidInput

_LETTERS = (
    r"0-9A-Za-z\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u024F\u0370-\u03FF\u0400-\u04FF"
    r"\u3040-\u30FF\u3400-\u4DBF\u4E00-\u9FFF\uAC00-\uD7A3"
)
COLLECTION_NAME_PATTERN = rf"^[{_LETTERS}][{_LETTERS}_.\-]{{0,63}}$"
_NAME = re.compile(COLLECTION_NAME_PATTERN)
NAME_RULE = (
    "collection names are 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit "
    "(letters of common scripts too: 照片 is a name)"
)


def check_collection_name(name: str) -> str:
    """`name` itself when it follows the rule; `InvalidInput` saying the rule otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or unicodedata.normalize("NFKC", name) != name:
        raise InvalidInput(NAME_RULE)
    return name


def collection_key(name: str) -> str:
    """The case-insensitive identity of a name (what must be unique)."""
    return name.casefold()
