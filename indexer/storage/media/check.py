"""Which bytes may be served as an item's image: one rule, used by the image and thumbnail routes.

An indexed path is only a name: whoever can write into an indexed folder can swap a photo for a
symlink to `/etc/passwd`, a hardlink to another file, or other bytes of the same size with the old
mtime put back. So nothing about the file is trusted; the bytes served are the bytes verified:

- the file is opened once, without following a symlink out of the folder it was indexed from
  (`record.root`; a path without any symlink when the root is unknown; the media folder for an
  upload's content-addressed copy), by `indexer.fs.safe_open.open_inside`;
- that descriptor must be a regular file of the recorded size, and its content, read into memory
  from the same descriptor, must have the recorded sha256. Size, mtime and inode are no evidence of
  content (`utime` restores an mtime; an in-place rewrite keeps the inode), and a stream from the
  descriptor after hashing could still change under it, so the hashed bytes themselves are served.
  Images are bounded by `max_image_bytes` at indexing time, so holding one in memory is bounded too.

Missing or refused files raise `NotFound` (404); a file whose bytes changed raises `MediaChanged`
(410): the item points at content that is gone, and re-indexing the folder will pick up the new one.
Blocking (open, read, hash): call from a worker thread.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from indexer.domain.records import ItemRecord
from indexer.errors import MediaChanged
from indexer.fs.safe_open import FileRefused, open_inside
from indexer.storage.media.store import media_file
from retrieval.errors import NotFound


def _open(record: ItemRecord, media_dir: Path) -> int:
    """The descriptor of `record`'s image file, reached without leaving its folder."""
    if record.kind != "images":
        raise NotFound(f"item {record.id} is a text; it has no image")
    if not record.sha256:
        raise NotFound(f"the image of item {record.id} is not served: no sha256 was recorded for it")
    root: Path | None = media_dir
    if record.path is None:
        path = media_file(media_dir, record.sha256, record.mime)
    else:
        path, root = Path(record.path), Path(record.root) if record.root is not None else None
    try:
        return open_inside(path, root)
    except FileRefused as exc:
        raise NotFound(f"the image file of item {record.id} {exc.reason}: not served") from exc
    except OSError as exc:  # unreadable (EACCES, EIO): not served, and not said to be missing
        reason = exc.strerror or type(exc).__name__
        raise NotFound(f"the image file of item {record.id} cannot be read ({reason}): not served") from exc


def _changed(record: ItemRecord) -> MediaChanged:
    return MediaChanged(f"the image file of item {record.id} has changed since it was indexed; re-index its folder")


def check_media(record: ItemRecord, media_dir: Path) -> None:
    """The cheap part of the rule, for a thumbnail already made from verified bytes: the file is
    still reachable inside its folder, a regular file of the recorded size. Raises like `read_media`."""
    fd = _open(record, media_dir)
    try:
        if record.size is not None and os.fstat(fd).st_size != record.size:
            raise _changed(record)
    finally:
        os.close(fd)


def read_media(record: ItemRecord, media_dir: Path) -> bytes:
    """`record`'s image bytes, exactly the ones that were indexed (see the module docstring), else
    `NotFound` / `MediaChanged`."""
    fd = _open(record, media_dir)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if record.size is not None and size != record.size:
            raise _changed(record)
        data = f.read(size + 1)  # one byte more than expected: a file growing while read shows
    if len(data) != size or hashlib.sha256(data).hexdigest() != record.sha256:
        raise _changed(record)
    return data
