"""Issue 21, finding 2: while clients read items' images and thumbnails through a live server, another
thread swaps the indexed files for a symlink to an outside file, a hardlink to one, or a same-size
rewrite with the old mtime put back. Not one response may carry the outside bytes, none may be cut
short or too long, none is a 500, and no thumbnail made during the race shows the outside image
(a changed file is 410, a missing or refused one 404)."""

from __future__ import annotations

import io
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from api import create_app
from api.config import Settings
from indexer.domain.records import NewImage
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import image_bytes, open_test_catalog
from tests.support.live_server import LiveServer

COLOURS = [(200, 10, 10), (10, 200, 10), (10, 10, 200)]
SECRET_COLOUR = (250, 250, 0)
MTIME_NS = 1_600_000_000_000_000_000  # every photo and the outside file: size and mtime all match
RACE_S = 2.5
CLIENTS = 4


def _photo(colour: tuple[int, int, int]) -> bytes:
    return image_bytes(colour, fmt="BMP")  # uncompressed: every colour gives the same size


def _put(path: Path, data: bytes) -> None:
    """Atomically put `data` at `path` with the shared mtime (a new inode, like a restore)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.utime(tmp, ns=(MTIME_NS, MTIME_NS))
    os.replace(tmp, path)


def _symlink(path: Path, secret: Path) -> None:
    tmp = path.with_name(f".{path.name}.link")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(secret)
    os.replace(tmp, path)


def _hardlink(path: Path, secret: Path) -> None:
    tmp = path.with_name(f".{path.name}.link")
    tmp.unlink(missing_ok=True)
    os.link(secret, tmp)
    os.replace(tmp, path)


def _rewrite(path: Path, secret: Path) -> None:
    with open(path, "r+b") as f:  # the same inode, the same size, the old mtime put back
        f.write(secret.read_bytes())
    os.utime(path, ns=(MTIME_NS, MTIME_NS))


SWAPS: dict[str, Callable[[Path, Path], None]] = {"symlink": _symlink, "hardlink": _hardlink, "rewrite": _rewrite}


@pytest.fixture
def gallery(settings: Settings, tmp_path: Path) -> Iterator[tuple[str, dict[int, bytes], Path, Path]]:
    """Three indexed photos (root known) behind a live server, and an outside file of their size."""
    root, outside = tmp_path / "gallery", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    secret = outside / "secret.bmp"
    _put(secret, _photo(SECRET_COLOUR))
    catalog = open_test_catalog(settings)
    catalog.create_collection("photos", "images", "fake", 8)
    images, originals = [], []
    for n, colour in enumerate(COLOURS):
        path = root / f"p{n}.bmp"
        _put(path, _photo(colour))
        originals.append(path.read_bytes())
        images.append(NewImage(data=originals[-1], path=str(path), root=str(root), mtime=path.stat().st_mtime))
    assert len({len(b) for b in [*originals, secret.read_bytes()]}) == 1
    ids = [r.id for r in catalog.add_images("photos", images, np.eye(3, 8, dtype=np.float32))]
    try:
        with LiveServer(create_app(settings, encoder=FakeEncoder(), catalog=catalog)) as live:
            yield live.base_url, dict(zip(ids, originals, strict=True)), root, secret
    finally:
        catalog.close()


def _colour(jpeg: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(jpeg)) as img:
        return np.asarray(img.convert("RGB"), dtype=np.float32).reshape(-1, 3).mean(axis=0)


def _is_secret_thumbnail(jpeg: bytes) -> bool:
    return bool(np.abs(_colour(jpeg) - np.asarray(SECRET_COLOUR)).max() < 40)


@pytest.mark.parametrize("swap", list(SWAPS))
def test_a_swap_race_never_serves_outside_bytes_nor_poisons_a_thumbnail(gallery, settings: Settings, swap: str) -> None:  # type: ignore[no-untyped-def]
    base_url, originals, root, secret = gallery
    by_path = {root / f"p{n}.bmp": data for n, data in enumerate(originals.values())}
    stop = threading.Event()
    statuses: Counter[tuple[str, int]] = Counter()
    wrong: Counter[str] = Counter()  # what a 200 carried that it must not
    lock = threading.Lock()

    def attack() -> None:
        thumbs = settings.data_dir / "thumbs"
        while not stop.is_set():
            for path, data in by_path.items():
                SWAPS[swap](path, secret)
                time.sleep(0.0005)
                _put(path, data)
            shutil.rmtree(thumbs, ignore_errors=True)  # evicted: made again from files in mid-swap

    def read() -> None:
        with httpx.Client(base_url=base_url, timeout=30) as client:
            while not stop.is_set():
                for item_id, data in originals.items():
                    for route in ("image", "thumbnail"):
                        r = client.get(f"/v1/items/{item_id}/{route}")
                        found = None
                        if r.status_code == 200 and route == "image" and r.content != data:
                            found = "outside bytes" if r.content == secret.read_bytes() else "other bytes"
                        elif r.status_code == 200 and route == "thumbnail" and _is_secret_thumbnail(r.content):
                            found = "outside thumbnail"
                        with lock:
                            statuses[(route, r.status_code)] += 1
                            if found:
                                wrong[found] += 1

    threads = [threading.Thread(target=attack)] + [threading.Thread(target=read) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    time.sleep(RACE_S)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    for path, data in by_path.items():
        _put(path, data)

    assert not wrong, f"{dict(wrong)} among {dict(statuses)}"
    assert {code for _, code in statuses} <= {200, 404, 410}, dict(statuses)
    assert statuses[("image", 200)] > 0 and statuses[("thumbnail", 200)] > 0, dict(statuses)
    # After the race: every thumbnail served, and every one cached, shows its own photo.
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for item_id, data in originals.items():
            assert client.get(f"/v1/items/{item_id}/image").content == data
            thumb = client.get(f"/v1/items/{item_id}/thumbnail")
            assert thumb.status_code == 200 and not _is_secret_thumbnail(thumb.content)
    cached = list((settings.data_dir / "thumbs").rglob("*.jpg"))
    assert cached and not [p for p in cached if _is_secret_thumbnail(p.read_bytes())]
