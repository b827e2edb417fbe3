"""`cnclip index-texts`: reading its input (one text per line, or JSONL {text, tags, extra}) and
embedding it into a text collection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from indexer.domain.records import NewText
from indexer.domain.values import text_problem, text_sha
from indexer.service.collections import CollectionService
from retrieval.errors import InvalidInput
from retrieval.json_text import loads


def _storable(new: NewText, where: str) -> NewText:
    """`new`, when its text and tags pass the one text rule (indexer/domain/values.py)."""
    for text in (new.text, *new.tags):
        if (problem := text_problem(text)) is not None:
            raise InvalidInput(f"{where}: the text or a tag {problem}")
    return new


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
            texts.append(_storable(NewText(line.strip()), f"{path}:{number}"))
            continue
        try:
            row = loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"{path}:{number}: not JSON ({exc.msg})") from exc
        text = row.get("text") if isinstance(row, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput(f'{path}:{number}: each line needs a non-empty "text"')
        tags = row.get("tags") or []
        extra = row.get("extra") or {}
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags) or not isinstance(extra, dict):
            raise InvalidInput(f'{path}:{number}: "tags" must be a list of strings and "extra" an object')
        texts.append(_storable(NewText(text.strip(), tags, extra), f"{path}:{number}"))
    return texts


async def index_texts(
    service: CollectionService,
    collection: str,
    texts: list[NewText],
    *,
    batch_size: int = 64,
    index_factory: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[int, int]:
    """Embed and add texts with the service's model (a text collection for image → text); returns
    (added, already there)."""
    service.ensure(collection, "texts", index_factory)
    known = set(service.content_index(collection))
    fresh = [t for t in texts if text_sha(t.text) not in known]
    added = 0
    for start in range(0, len(fresh), batch_size):
        batch = fresh[start : start + batch_size]
        results = await service.writes.add_text_items(collection, batch)
        added += sum(r.created for r in results)
        if on_progress:
            on_progress(len(batch), added)
    await asyncio.to_thread(service.flush, collection)
    return added, len(texts) - added
