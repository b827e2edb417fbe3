"""Which file may be served as an item's image: one rule, used by the image and thumbnail routes.

An indexed path is only a name: whoever can write into an indexed folder can replace a photo with
another file or with a symlink to `/etc/passwd`. So the bytes are served only while they are still
the bytes that were indexed:

- an upload (`record.path is None`) is served from its content-addressed copy under the media
  folder, and only if that copy really lies inside the media folder;
- a bulk-indexed file is served only through a path whose real location stays inside the folder
  it was indexed from (`record.root`, when the catalog knows it); when the root is unknown, only
  a path without any symlink is served;
- it must be a regular file with the size and mtime recorded at indexing time; if either differs
  (a `touch`, a copy that kept the bytes) its sha256 is recomputed and must equal the recorded one.

Missing or refused files raise `NotFound` (404); a file whose bytes changed raises `MediaChanged`
(410): the item points at content that is gone, and re-indexing the folder will pick up the new one.
Blocking (stat, hashing): call from a worker thread.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from indexer.media import media_file
from indexer.types import ItemRecord
from retrieval.errors import CnclipError, NotFound

_HASH_CHUNK = 1 << 20


class MediaChanged(CnclipError):
    """The file at an item's indexed path no longer holds the bytes that were indexed."""

    code = "gone"


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _real_path(path: Path, item_id: int) -> Path:
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # missing, a dangling link, a symlink loop
        raise NotFound(f"the image file of item {item_id} is missing") from exc


def _upload_path(record: ItemRecord, media_dir: Path) -> Path:
    stored = media_file(media_dir, record.sha256 or "", record.mime)
    real = _real_path(stored, record.id)
    if not _inside(real, media_dir.resolve()):
        raise NotFound(f"the stored image of item {record.id} is not served: it leaves the media folder")
    return real


def _indexed_path(record: ItemRecord, path: Path) -> Path:
    absolute = Path(os.path.abspath(path))
    real = _real_path(absolute, record.id)
    root = record.root  # the folder the file was indexed from (unknown for rows indexed before storage v2)
    if root is not None:
        if not _inside(real, Path(root).resolve()):
            raise NotFound(f"the image file of item {record.id} is not served: it leads outside its indexed folder")
    elif real != absolute:
        raise NotFound(f"the image file of item {record.id} is not served: its path goes through a symlink")
    return real


def verified_media_path(record: ItemRecord, media_dir: Path) -> Path:
    """The real path of `record`'s image if it may be served (see the module docstring), else
    `NotFound` / `MediaChanged`."""
    if record.kind != "images":
        raise NotFound(f"item {record.id} is a text; it has no image")
    real = _upload_path(record, media_dir) if record.path is None else _indexed_path(record, Path(record.path))
    try:
        info = os.stat(real)
    except OSError as exc:
        raise NotFound(f"the image file of item {record.id} is missing") from exc
    if not stat.S_ISREG(info.st_mode):
        raise NotFound(f"the image file of item {record.id} is not a regular file")
    unchanged = record.size == info.st_size and record.mtime is not None and record.mtime == info.st_mtime
    if record.path is None or unchanged:
        # Uploads are content-addressed copies the server wrote itself; an unchanged stat is trusted.
        return real
    if record.sha256 is None or _sha256(real) != record.sha256:
        raise MediaChanged(f"the image file of item {record.id} has changed since it was indexed; re-index its folder")
    return real
