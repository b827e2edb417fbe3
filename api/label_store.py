"""Saved zero-shot label sets, in one small JSON file under the data dir.

Writes go to a temporary file that replaces the old one (`os.replace` is atomic), under a lock,
so a crash never leaves a half-written file and two writers never lose each other's sets.
The file is tiny (at most a few hundred sets of at most 100 labels), so it is read whole.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from retrieval.errors import InvalidInput, NotFound
from retrieval.json_text import loads
from retrieval.regular_file import UnusableFile, read_regular_text

MAX_LABEL_SETS = 500
MAX_FILE_BYTES = 64 << 20  # 500 sets of labels and templates within the request limits take far less


class LabelSetStore:
    """name -> {"labels": [...], "templates": [...] | None}. Blocking file I/O: call from a thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def _load(self) -> dict[str, dict[str, Any]]:
        try:  # a regular file only: a FIFO or a device at this path must not hang or flood a request
            text = read_regular_text(self.path, MAX_FILE_BYTES, "label set file")
        except UnusableFile as exc:
            if exc.missing:
                return {}
            raise InvalidInput(f"label set file {exc.message}; fix or remove it") from None
        try:
            data = loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"label set file {self.path} is not valid JSON; fix or remove it") from exc
        return data if isinstance(data, dict) else {}

    def _save(self, data: dict[str, dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".label_sets.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, ensure_ascii=False, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def all_sets(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return self._load()

    def get(self, name: str) -> dict[str, Any]:
        with self._lock:
            data = self._load()
        if name not in data:
            raise NotFound(f"no label set named {name!r}")
        return data[name]

    def put(self, name: str, labels: list[str], templates: list[str] | None) -> bool:
        """Save a set; True when it is new, False when it replaced one."""
        with self._lock:
            data = self._load()
            created = name not in data
            if created and len(data) >= MAX_LABEL_SETS:
                raise InvalidInput(f"at most {MAX_LABEL_SETS} label sets; delete one first")
            data[name] = {"labels": labels, "templates": templates}
            self._save(data)
            return created

    def delete(self, name: str) -> None:
        with self._lock:
            data = self._load()
            if name not in data:
                raise NotFound(f"no label set named {name!r}")
            del data[name]
            self._save(data)
