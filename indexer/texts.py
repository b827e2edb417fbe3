"""Reading the input of `cnclip index-texts`: one text per line, or JSONL {text, tags, extra}."""

from __future__ import annotations

import json
from pathlib import Path

from indexer.types import NewText
from retrieval.errors import InvalidInput


def read_texts(path: Path) -> list[NewText]:
    """Texts of a file; a `.jsonl` file has one {"text", "tags", "extra"} object per line.
    Blank lines are skipped; a malformed JSONL line is an error naming its line number."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read {path}: {exc}") from exc
    texts: list[NewText] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if path.suffix.lower() != ".jsonl":
            texts.append(NewText(line.strip()))
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"{path}:{number}: not JSON ({exc.msg})") from exc
        text = row.get("text") if isinstance(row, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput(f'{path}:{number}: each line needs a non-empty "text"')
        tags = row.get("tags") or []
        extra = row.get("extra") or {}
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags) or not isinstance(extra, dict):
            raise InvalidInput(f'{path}:{number}: "tags" must be a list of strings and "extra" an object')
        texts.append(NewText(text.strip(), tags, extra))
    return texts
