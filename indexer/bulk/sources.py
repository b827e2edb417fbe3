"""What `cnclip index` reads: a folder (walked recursively) or a JSONL/CSV manifest of files."""

from __future__ import annotations

import csv
import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indexer.domain.values import text_problem
from indexer.fs.file_names import check_file_name
from indexer.fs.presence import gone_error
from indexer.fs.safe_open import inside
from retrieval.errors import InvalidInput
from retrieval.json_text import loads
from retrieval.raw_photos import RAW_SUFFIXES

MANIFEST_SUFFIXES = {".jsonl", ".csv"}
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff", ".heic", ".heif", ".hif", ".avif"}
IMAGE_SUFFIXES |= RAW_SUFFIXES  # .dng .cr2 .cr3 .nef .arw .raf .orf .rw2 (retrieval/raw_photos.py)
# File signatures of the formats Pillow opens: a file that starts like an image and cannot be read is
# a broken image (reported); anything else in a folder is simply not an image (counted, not reported).
IMAGE_SIGNATURES: tuple[bytes, ...] = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"II*\x00")
# Big-endian TIFF; camera RAWs' own: RAF, ORF, RW2.
IMAGE_SIGNATURES += (b"MM\x00*", b"FUJIFILMCCD-RAW", b"IIRO", b"IIRS", b"MMOR", b"IIU\x00")
# ISO base media files (HEIC/HEIF, AVIF, CR3) by their `ftyp` major brand, at bytes 8–12.
FTYP_BRANDS = (b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1", b"avif", b"avis", b"crx ")


@dataclass(frozen=True)
class SourceEntry:
    path: Path  # absolute
    caption: str | None = None
    tags: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    listed: bool = False  # named by a manifest: it must be an image, so any failure is reported
    # The folder the file is indexed from: the walked folder, or a manifest's folder for the files
    # inside it (None for a manifest's file elsewhere). The API shows paths relative to it; the
    # media check serves only files that stay inside it (indexer/storage/media/check.py).
    root: Path | None = None  # (resolved) the file is read without leaving it (indexer/fs/safe_open.py)


def looks_like_image(path: Path, head: bytes) -> bool:
    """Whether a file claims to be an image (by its first bytes or, failing that, its name)."""
    if head.startswith(IMAGE_SIGNATURES) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        return True
    if head[4:8] == b"ftyp" and head[8:12] in FTYP_BRANDS:
        return True
    return path.suffix.lower() in IMAGE_SUFFIXES


def identities(folders: Iterable[Path]) -> frozenset[tuple[int, int]]:
    """(device, inode) of each of these folders that exists: what a walk must not enter, however it
    is reached (the data dir: the product's own files, uploads' copies and thumbnails)."""
    found = set()
    for folder in folders:
        try:
            info = os.stat(folder)
        except OSError:
            continue
        found.add((info.st_dev, info.st_ino))
    return frozenset(found)


def load_entries(
    source: Path, skip: frozenset[tuple[int, int]] = frozenset()
) -> tuple[list[SourceEntry], list[tuple[str, str]]]:
    """The files to index and the manifest lines that could not be used, as (where, why). `skip`:
    folders a walk does not enter (`identities`)."""
    source = source.expanduser()
    if source.is_dir():
        return walk_folder(source, skip=skip)
    if source.is_file() and source.suffix.lower() in MANIFEST_SUFFIXES:
        return read_manifest(source)
    if source.is_file():
        raise InvalidInput(f"{source} is neither a folder nor a .jsonl/.csv manifest")
    raise InvalidInput(f"{source} does not exist")


def walk_folder(
    root: Path, start: Path | None = None, skip: frozenset[tuple[int, int]] = frozenset()
) -> tuple[list[SourceEntry], list[tuple[str, str]]]:
    """Every regular file under `root`, sorted, and the files refused as (path, why). Hidden folders
    and files are skipped, symlinked folders not followed; a symlinked file is indexed when its
    target stays inside `root` (it is served from there), and refused when it leads out: the server
    would never serve it, and reading it would put an outside file's content into the catalog.
    `start`: walk only this folder inside `root` (a folder watcher's changed one), with `root`'s rules;
    `skip`: folders (by identity) not entered."""
    entries: list[SourceEntry] = []
    refused: list[tuple[str, str]] = []
    top = root.resolve()

    def unreadable(exc: OSError) -> None:  # a folder that cannot be listed: said, and not pruned (presence.py)
        if not gone_error(exc):
            refused.append((str(exc.filename), f"cannot read: {exc.strerror or exc}; skipped"))

    for folder, subfolders, files in os.walk(start or top, onerror=unreadable):
        subfolders[:] = sorted(
            name
            for name in subfolders
            if not name.startswith(".") and not (skip and identities([Path(folder) / name]) & skip)
        )
        for name in sorted(files):
            found = folder_entry(top, Path(folder) / name)
            if isinstance(found, SourceEntry):
                entries.append(found)
            elif found is not None:
                refused.append(found)
    return entries, refused


def folder_entry(top: Path, path: Path) -> SourceEntry | tuple[str, str] | None:
    """The entry of one file found in the (resolved) folder `top`, the refusal (path, why) of a symlink
    that leads out of it, or None for what a walk skips: a hidden file, not a regular file."""
    if path.name.startswith("."):
        return None
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # symlinks followed, as `is_file` did
            return None
    except OSError as exc:  # gone meanwhile: skipped; unreadable (a folder without x, EIO): said
        return None if gone_error(exc) else (str(path), f"cannot read: {exc.strerror or exc}")
    if path.is_symlink() and not inside(path.resolve(), top):
        return str(path), "a symlink that leads outside the indexed folder: not followed"
    return SourceEntry(path, root=top)


def _tags(value: Any) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return tuple(t.strip() for t in re.split(r"[;|]", value) if t.strip())
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return tuple(t.strip() for t in value if t.strip())
    raise ValueError("tags must be a list of strings or a ';'-separated string")


def _entry(base: Path, row: dict[str, Any]) -> SourceEntry:
    raw = row.get("path")
    if not isinstance(raw, str) or not raw:
        raise ValueError("no 'path'")
    check_file_name(raw)  # NUL or a lone surrogate: no file has that name (os functions would raise)
    caption = row.get("caption")
    if caption is not None and not isinstance(caption, str):
        raise ValueError("'caption' must be a string")
    for text in [caption or "", *_tags(row.get("tags"))]:  # the one text rule (indexer/domain/values.py)
        if (problem := text_problem(text)) is not None:
            raise ValueError(f"a caption or tag {problem}")
    extra = row.get("extra") or {}
    if not isinstance(extra, dict):
        raise ValueError("'extra' must be an object")
    path = Path(raw).expanduser()
    path = (path if path.is_absolute() else base / path).resolve()
    root = base if base in path.parents else None  # like a folder's files: relative to the manifest's folder
    return SourceEntry(path, caption or None, _tags(row.get("tags")), extra, listed=True, root=root)


def read_manifest(manifest: Path) -> tuple[list[SourceEntry], list[tuple[str, str]]]:
    """JSONL ({"path", "caption", "tags", "extra"} per line) or CSV (header path,caption,tags; tags
    separated by ';'). Relative paths are relative to the manifest's folder."""
    base = manifest.resolve().parent
    entries: list[SourceEntry] = []
    problems: list[tuple[str, str]] = []
    with open(manifest, encoding="utf-8", newline="") as f:
        if manifest.suffix.lower() == ".csv":
            reader = csv.DictReader(f)
            if not reader.fieldnames or "path" not in reader.fieldnames:
                raise InvalidInput(f"{manifest}: the CSV header must name a 'path' column")
            rows: list[tuple[int, Any]] = [(n + 2, row) for n, row in enumerate(reader)]
        else:
            rows = []
            for number, line in enumerate(f, start=1):
                if line.strip():
                    try:
                        rows.append((number, loads(line)))
                    except json.JSONDecodeError as exc:
                        problems.append((f"{manifest}:{number}", f"not JSON: {exc.msg}"))
    for number, row in rows:
        try:
            if not isinstance(row, dict):
                raise ValueError("each line must be a JSON object")
            entries.append(_entry(base, row))
        except ValueError as exc:
            problems.append((f"{manifest}:{number}", str(exc)))
    return entries, problems
