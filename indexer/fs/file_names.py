"""File names that are not valid UTF-8, kept exactly.

A POSIX file name is bytes. Python hands `cnclip index` an undecodable byte (a GBK or Shift-JIS name
unpacked on a UTF-8 system, `img-\\xff.png`) as a lone surrogate (U+DC80 + byte, PEP 383), which
SQLite's and PostgreSQL's drivers refuse to store, which JSON cannot carry and which a UTF-8
terminal cannot print. Such a file is indexed like any other, not skipped: the photo is still
searchable, `/image` still opens it, and a rerun finds it unchanged.

- In SQL (`to_sql` / `from_sql`, applied to the path columns by indexer/storage/sql/models.py) a path with
  undecodable bytes is stored as `bytes:` + the path with each such byte written `%XX` and `%`
  written `%25`. A valid UTF-8 path is stored as it is, so every existing row keeps its text; the
  prefix cannot begin a stored path (they are absolute), and a path that begins with it anyway is
  escaped too, so the mapping is one-to-one and reading gives back the very bytes.
- For people (`printable`: the API's file names, the CLI's lines and report) an undecodable byte
  is shown as `\\xff`: readable, valid UTF-8, not meant to be opened.
"""

from __future__ import annotations

import re

SQL_PREFIX = "bytes:"
_ESCAPED = re.compile(r"%(25|[89A-F][0-9A-F])")


def is_text(path: str) -> bool:
    """Whether `path` is valid Unicode text (no lone surrogates): what SQL, JSON and a terminal take."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_file_name(path: str) -> None:
    """`ValueError` for a name no file can have: NUL, or a lone surrogate that is not an undecodable
    byte (`\\ud800` from a JSON manifest); what a folder walk yields always passes."""
    if "\x00" in path:
        raise ValueError("a file name cannot contain NUL")
    try:
        path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ValueError("not a file name: it holds a lone UTF-16 surrogate") from None


def to_sql(path: str) -> str:
    """The text a path column stores for `path` (itself, unless it holds undecodable bytes)."""
    if is_text(path) and not path.startswith(SQL_PREFIX):
        return path
    check_file_name(path)
    escaped = (
        f"%{ord(char) - 0xDC00:02X}" if "\udc80" <= char <= "\udcff" else "%25" if char == "%" else char
        for char in path
    )
    return SQL_PREFIX + "".join(escaped)


def from_sql(text: str) -> str:
    """The path (undecodable bytes as surrogates again, as `os` functions take it) stored as `text`."""
    if not text.startswith(SQL_PREFIX):
        return text
    return _ESCAPED.sub(
        lambda match: "%" if match.group(1) == "25" else chr(0xDC00 + int(match.group(1), 16)),
        text[len(SQL_PREFIX) :],
    )


def printable(path: str) -> str:
    """`path` for people: each undecodable byte shown as `\\xNN` (valid UTF-8, safe in JSON)."""
    if is_text(path):
        return path
    try:
        raw = path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that is no byte: show its code point
        return path.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")
