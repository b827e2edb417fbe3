"""The content-addressed copy of uploaded image bytes under the data dir."""

from __future__ import annotations

import os
from pathlib import Path

EXTENSIONS = {
    "image/jpeg": ".jpg",
    "image/png": ".png",
    "image/webp": ".webp",
    "image/gif": ".gif",
    "image/bmp": ".bmp",
}


def media_root(data_dir: Path) -> Path:
    """The folder under the data dir that holds the copies of uploaded images."""
    return data_dir / "media"


def media_file(media_dir: Path, sha256: str, mime: str | None) -> Path:
    """Where an upload with this content lives: media/ab/abcdef….jpg (content-addressed)."""
    return media_dir / sha256[:2] / f"{sha256}{EXTENSIONS.get(mime or '', '.bin')}"


def store_media(media_dir: Path, sha256: str, mime: str | None, data: bytes) -> Path:
    """Copy upload bytes in place once (temp file + rename, so a crash never leaves half a file)."""
    target = media_file(media_dir, sha256, mime)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return target
