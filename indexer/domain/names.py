"""The one rule for collection names, used by the catalog, the service, the CLI and the API schemas.

A name is 1-64 characters: ASCII letters and digits, and the letters and digits of the common
scripts (Latin with accents, Greek, Cyrillic, kana, CJK ideographs, Hangul: `照片` is a name), then
also `_`, `-` or `.`; it starts with a letter or digit.

The pattern is the whole rule, and it means the same to Python's `re`, to pydantic's Rust regex and
to the ECMA-262 dialect of the OpenAPI document: the ranges are spelled out as BMP `\\uXXXX` escapes
(no word classes, no flags, no look-arounds). From those scripts' blocks they leave out what is not
a letter or digit (marks, punctuation, symbols, unassigned code points) and every character that NFKC
changes (`ŉ`, `ǅ`, `ϐ`: compatibility look-alikes), so that any string the pattern accepts is already
in NFKC form; no check happens beside the pattern that a caller of the pattern alone could miss.
tests/indexer/domain/test_names.py walks every BMP code point through all three engines and proves both claims.

Names are unique case-insensitively: `collection_key` is what the database's unique constraint
holds, so `demo` and `DEMO` cannot coexist.
"""

from __future__ import annotations

import re

from retrieval.errors import InvalidInput

# Blocks: Latin-1 letters and Latin Extended-A/B, Greek, Cyrillic, Hiragana, Katakana, CJK Extension A,
# CJK Unified Ideographs, Hangul syllables; less what the module docstring says (Unicode 14, Python 3.11).
_LETTERS = (
    r"0-9A-Za-z\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u0131\u0134-\u013E\u0141-\u0148\u014A-\u017E"
    r"\u0180-\u01C3\u01CD-\u01F0\u01F4-\u024F"
    r"\u0370-\u0373\u0376-\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03CF"
    r"\u03D7-\u03EF\u03F3\u03F7-\u03F8\u03FA-\u03FF"
    r"\u0400-\u0481\u048A-\u04FF"
    r"\u3041-\u3096\u309D-\u309E\u30A1-\u30FA\u30FC-\u30FE"
    r"\u3400-\u4DBF\u4E00-\u9FFF\uAC00-\uD7A3"
)
# The blocks the ranges above are cut from (tests/indexer/domain/test_names.py derives the ranges from them).
SCRIPT_BLOCKS = (
    (0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A), (0xC0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF),
    (0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
)  # fmt: skip
COLLECTION_NAME_PATTERN = rf"^[{_LETTERS}][{_LETTERS}_.\-]{{0,63}}$"
_NAME = re.compile(COLLECTION_NAME_PATTERN)
NAME_RULE = (
    "collection names are 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit "
    "(letters of common scripts too: 照片 is a name)"
)


def check_collection_name(name: str) -> str:
    """`name` itself when it follows the rule; `InvalidInput` saying the rule otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInput(NAME_RULE)
    return name


def collection_key(name: str) -> str:
    """The case-insensitive identity of a name (what must be unique)."""
    return name.casefold()
