"""The one rule for collection names, used by the catalog, the service, the CLI and the API schemas.

A name is 1-64 characters: letters or digits of any script (so `照片` is a name), then also `_`,
`-` or `.`; it starts with a letter or digit and is already in NFKC form (no look-alike
compatibility characters). Names are unique case-insensitively: `collection_key` is what the
database's unique constraint holds, so `demo` and `DEMO` cannot coexist.
"""

from __future__ import annotations

import re
import unicodedata

from retrieval.errors import InvalidInput

# Written for both Python's `re` and the Rust regex pydantic uses (both read \w as Unicode).
COLLECTION_NAME_PATTERN = r"^[^\W_][\w.\-]{0,63}$"
_NAME = re.compile(COLLECTION_NAME_PATTERN)
NAME_RULE = (
    "collection names are 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit "
    "(any script: 照片 is a name)"
)


def check_collection_name(name: str) -> str:
    """`name` itself when it follows the rule; `InvalidInput` saying the rule otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or unicodedata.normalize("NFKC", name) != name:
        raise InvalidInput(NAME_RULE)
    return name


def collection_key(name: str) -> str:
    """The case-insensitive identity of a name (what must be unique)."""
    return name.casefold()
