"""A camera RAW beside a rendered image of the same shot is one photo, not two.

Cameras set to RAW+JPEG (or RAW+HEIF) write `IMG_0042.CR3` and `IMG_0042.JPG` into one folder. The
rendered image is the item (it is what the camera made of the shot, and it is smaller and quicker to
read); the RAW beside it is its companion: not read, not embedded, counted as `raw_companions` in
the run's summary. A RAW alone is indexed like any image (retrieval/raw_photos.py). A RAW a manifest
names is indexed whatever lies beside it: the manifest asked for it.

"Beside" is decided on disk, not among the entries of this run, so that a folder watcher's pass over
one new file reaches the same answer as a full walk: same folder, same name up to the suffix (case
ignored), the other file with a non-RAW image suffix (indexer/bulk/sources.py `IMAGE_SUFFIXES`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from indexer.bulk.sources import IMAGE_SUFFIXES, SourceEntry
from retrieval.raw_photos import RAW_SUFFIXES

RENDERED_SUFFIXES = frozenset(IMAGE_SUFFIXES - RAW_SUFFIXES)


def _rendered_stems(folder: Path) -> frozenset[str]:
    """The (case-folded) stems of the rendered images directly in `folder`; empty when unreadable."""
    try:
        names = os.listdir(folder)
    except OSError:
        return frozenset()
    stems = set()
    for name in names:
        stem, suffix = os.path.splitext(name)
        if suffix.lower() in RENDERED_SUFFIXES and not name.startswith("."):
            stems.add(stem.casefold())
    return frozenset(stems)


def raw_companions(entries: Iterable[SourceEntry]) -> set[Path]:
    """The paths of the entries that are RAW companions of a rendered image (see the module docstring)."""
    found: set[Path] = set()
    folders: dict[Path, frozenset[str]] = {}
    for entry in entries:
        path = entry.path
        if entry.listed or path.suffix.lower() not in RAW_SUFFIXES:
            continue
        stems = folders.get(path.parent)
        if stems is None:
            stems = folders[path.parent] = _rendered_stems(path.parent)
        if path.stem.casefold() in stems:
            found.add(path)
    return found
