"""The reader stage of `cnclip index`: read, hash, probe and date one file (in reader threads), and
take the perceptual hash (indexer/domain/perceptual.py) of the files that will be embedded — from the
decode that makes the model's pixels when the reader decodes (`pixels_and_hash`), else on its own."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from indexer.bulk.sources import SourceEntry, looks_like_image
from indexer.domain.perceptual import phash_of_bytes, phash_or_none
from indexer.domain.records import FileState, NewImage
from indexer.domain.taken import Taken, taken_from, taken_of
from indexer.fs.safe_open import FileRefused, open_inside
from retrieval.errors import InvalidImage
from retrieval.preprocess import DEFAULT_MAX_BYTES, ImagePreprocessor, read_header

_HEAD = 16  # bytes enough to tell an image's signature (indexer/bulk/sources.py)

Decoded = tuple[np.ndarray, int | None]  # the model's pixels, and the perceptual hash of the same decode
Decode = Callable[[bytes], Decoded]


def pixels_and_hash(preprocess: ImagePreprocessor, data: bytes, hashed: bool = True) -> Decoded:
    """The model's pixels and (`hashed`) the perceptual hash, from one decode: the hash decodes at full
    scale as the encoder does (indexer/domain/perceptual.py), so it is the value `phash_of_bytes` gives."""
    image = preprocess.decode(data)
    return preprocess.normalise(image), phash_or_none(image) if hashed else None


@dataclass
class PreparedFile:
    """One file read, hashed, probed and dated by a reader thread, ready to embed."""

    entry: SourceEntry
    data: bytes
    sha256: str
    mime: str
    width: int
    height: int
    size: int
    mtime: float
    replaces: int | None  # the row of this path's previous content
    taken: Taken
    decode_error: str | None = None  # why the encoder would refuse (or refused) the pixels
    phash: int | None = None  # perceptual hash, taken when `needs_hash` said so
    pixels: np.ndarray | None = None  # what `decode` made of the bytes (None: not decoded here)

    def new_image(self) -> NewImage:
        """The image to add, with everything the reader learnt (the service reads nothing again)."""
        entry = self.entry
        return NewImage(
            data=self.data,
            path=str(entry.path),
            root=str(entry.root) if entry.root is not None else None,
            caption=entry.caption,
            tags=list(entry.tags),
            extra=dict(entry.extra),
            mtime=self.mtime,
            mime=self.mime,
            width=self.width,
            height=self.height,
            sha256=self.sha256,
            taken_at=self.taken[0],
            taken_source=self.taken[1],
            phash=self.phash,
        )


class TooLarge(Exception):
    """A file over the byte limit, refused before its bytes are read: `head` (its first bytes) says
    whether it claims to be an image."""

    def __init__(self, size: int, limit: int, head: bytes) -> None:
        super().__init__(f"the image is {size:,} bytes; the limit is {limit:,} bytes")
        self.head = head


def _read_inside(entry: SourceEntry, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[bytes, float]:
    """The file's bytes and mtime, read from one descriptor opened without leaving the walked folder
    (indexer/fs/safe_open.py): a file swapped for a link out of the folder after the walk is not read.
    At most `max_bytes` are ever held: the descriptor's size is checked before reading, and the read
    stops one byte past the limit (a file growing meanwhile, a sparse 3 GB file, is refused, not
    read whole). Raises `TooLarge`, `FileRefused` or `OSError`."""
    with os.fdopen(open_inside(entry.path, entry.root), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise TooLarge(size, max_bytes, f.read(_HEAD))
        data = f.read(max_bytes + 1)
        if len(data) > max_bytes:  # it grew after the fstat
            raise TooLarge(max(len(data), os.fstat(f.fileno()).st_size), max_bytes, data[:_HEAD])
        return data, os.fstat(f.fileno()).st_mtime


def read_file(
    entry: SourceEntry,
    state: FileState | None,
    decode: Decode | None = None,
    needs_hash: Callable[[str], bool] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> PreparedFile | tuple[str, str] | None:
    """Read, hash and probe one file (reader thread). None: not an image; (path, reason): a bad file.

    `decode`: also decode the pixels the way the encoder does and keep them, or why that fails (a
    truncated JPEG: its header is fine, its data is not): the dry run, and a run whose encoder takes
    pixels (indexer/bulk/embedding.py). `needs_hash(sha256)`: whether these are new bytes, whose
    perceptual hash is taken (from `decode`'s decode when there is one) and, with `decode`, pixels
    made; not for bytes the collection has: a rename or a copy costs no decoding. Without `needs_hash` every file is decoded (the dry run).
    `max_bytes`: the server's image limit; a larger file is a bad file (when it claims to be an
    image) and is never read whole."""
    try:
        data, mtime = _read_inside(entry, max_bytes)
    except TooLarge as exc:
        if entry.listed or looks_like_image(entry.path, exc.head):
            return str(entry.path), str(exc)
        return None
    except FileRefused as exc:
        return str(entry.path), f"not read: {exc.message}"
    except OSError as exc:
        return str(entry.path), f"cannot read: {exc.strerror or exc}"
    try:
        header = read_header(data, max_bytes)  # the one header read of this file: format, size, EXIF date
    except InvalidImage as exc:
        if entry.listed or looks_like_image(entry.path, data[:16]):
            return str(entry.path), exc.message
        return None
    sha = hashlib.sha256(data).hexdigest()
    replaces = state.id if state is not None and state.sha256 != sha else None
    taken = taken_from(header, mtime)
    new_bytes = needs_hash is not None and needs_hash(sha)
    decode_error, pixels, phash = None, None, None
    if decode is not None and (needs_hash is None or new_bytes):
        try:
            pixels, phash = decode(data)
        except InvalidImage as exc:
            decode_error = exc.message  # the same decode: no hash to take either
    elif new_bytes:
        phash = phash_of_bytes(data)
    size = len(data)
    return PreparedFile(
        entry,
        data,
        sha,
        header.mime,
        header.width,
        header.height,
        size,
        mtime,
        replaces,
        taken,
        decode_error,
        phash,
        pixels,
    )


def read_phash(entry: SourceEntry, max_bytes: int = DEFAULT_MAX_BYTES) -> int | None:
    """The perceptual hash of a file already indexed (the backfill); None when it cannot be read now."""
    try:
        return phash_of_bytes(_read_inside(entry, max_bytes)[0], max_bytes)
    except (TooLarge, FileRefused, OSError):
        return None


def read_taken(entry: SourceEntry, max_bytes: int = DEFAULT_MAX_BYTES) -> Taken | None:
    """The date of a file already indexed (the backfill); None when it cannot be read now."""
    try:
        return taken_of(*_read_inside(entry, max_bytes))
    except (TooLarge, FileRefused, OSError):
        return None
