"""The folder watchers' settings: how long a file must be quiet, how often a folder is rescanned or
polled (`WatchTuning`, part of the storage settings: `cnclip index --watch` uses them too), and which
folders `cnclip serve` watches (`CNCLIP_WATCH`, parsed and checked here, declared by the server's
settings).

`CNCLIP_WATCH` is a JSON object, folder → collection, as every structured setting is JSON:

    CNCLIP_WATCH='{"/srv/photos": "photos", "/mnt/nas/scans": "scans"}'

Folders are absolute (`~` is expanded); a folder listed twice, or a folder inside another one
watched into the same collection, is refused (two watchers would prune each other's rows), as is a
collection name `cnclip index` would refuse.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from indexer.domain.names import check_collection_name, collection_key
from indexer.fs.file_names import check_file_name
from retrieval.errors import CnclipError
from retrieval.json_text import loads

WATCH_FORMAT = 'a JSON object of folder → collection, e.g. {"/srv/photos": "photos"}'


class WatchTuning(BaseModel):
    """Mixed into the storage settings (a plain model: the settings class it joins reads the environment)."""

    watch_quiet_s: float = Field(
        1.0,
        gt=0,
        le=60,
        description="A watched file is read once its size and mtime have not changed for this long "
        "(a file still being written is not read half-done).",
    )
    watch_rescan_interval_s: float = Field(
        300.0,
        ge=1,
        le=86_400,
        description="Watched folders are walked and reconciled with SQL this often, catching what events missed "
        "(`cnclip index --watch --rescan-interval` overrides it).",
    )
    watch_poll_interval_s: float = Field(
        2.0,
        ge=0.1,
        le=3_600,
        description="Folders inotify cannot see (network filesystems, past the inotify watch limit) are polled "
        "this often, and never more than a fifth of the time.",
    )


@dataclass(frozen=True)
class WatchedFolder:
    folder: Path  # absolute, normalised (not resolved: it may not exist yet when the settings are read)
    collection: str


def parse_watch_setting(value: Any) -> dict[str, str]:
    """`CNCLIP_WATCH` as given (a JSON text from the environment, or a mapping) → folder → collection,
    checked. Raises ValueError with one line that says what is wrong."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = loads(value, unique_keys=True)  # nested 50,000 deep or a folder named twice: refused
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg}); write {WATCH_FORMAT}") from None
    if not isinstance(value, dict):
        raise ValueError(f"must be {WATCH_FORMAT}")
    folders = [_watched(folder, collection) for folder, collection in value.items()]
    _no_overlap(folders)
    return {str(w.folder): w.collection for w in folders}


def watched_folders(setting: dict[str, str]) -> list[WatchedFolder]:
    """The parsed setting as records."""
    return [WatchedFolder(Path(folder), collection) for folder, collection in setting.items()]


def _watched(folder: Any, collection: Any) -> WatchedFolder:
    if not isinstance(folder, str) or not folder.strip():
        raise ValueError(f"a folder must be a non-empty string; write {WATCH_FORMAT}")
    if not isinstance(collection, str):
        raise ValueError(f"{folder}: the collection must be a string (a name); write {WATCH_FORMAT}")
    try:
        check_file_name(folder)
    except ValueError as exc:
        raise ValueError(f"{folder!r}: {exc}") from None
    try:
        name = check_collection_name(collection)
    except CnclipError as exc:
        raise ValueError(f"{folder}: {exc.message}") from None
    path = Path(os.path.expanduser(folder))
    if not path.is_absolute():
        raise ValueError(f"{folder}: give an absolute folder (a relative one depends on where the server starts)")
    return WatchedFolder(Path(os.path.normpath(path)), name)


def _no_overlap(folders: list[WatchedFolder]) -> None:
    for i, one in enumerate(folders):
        for other in folders[i + 1 :]:
            if one.folder == other.folder:
                raise ValueError(f"{one.folder} is listed twice")
            nested = one.folder in other.folder.parents or other.folder in one.folder.parents
            if nested and collection_key(one.collection) == collection_key(other.collection):
                raise ValueError(
                    f"{one.folder} and {other.folder} are nested and watched into the same collection "
                    f"{one.collection}: list only the outer one"
                )
