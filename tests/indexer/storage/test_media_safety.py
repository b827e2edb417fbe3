"""Media are served only while they are the bytes that were indexed, never through a symlink out of
the indexed folder (issue 15): a photo replaced by a link to /etc/passwd is not served (404), edited
bytes are 410, a `touch` that keeps the bytes still serves; thumbnails follow the same rule."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from api.config import Settings
from indexer.domain.records import ItemRecord, NewImage
from indexer.fs.safe_open import FileRefused, _walk
from indexer.storage.catalog import SqlCatalog
from indexer.storage.media.check import MediaChanged, read_media
from retrieval.errors import NotFound
from tests.support.api_helpers import api_client, image_bytes, open_test_catalog

SECRET = Path("/etc/passwd")


@pytest.fixture
def indexed(settings: Settings, tmp_path: Path) -> Iterator[tuple[TestClient, SqlCatalog, dict[str, int], Path]]:
    """Two bulk-indexed photos (paths under `gallery/`) and one upload, behind a client."""
    gallery = tmp_path / "gallery"
    gallery.mkdir()
    catalog = open_test_catalog(settings)
    assert isinstance(catalog, SqlCatalog)
    catalog.create_collection("photos", "images", "fake", 8)
    images = []
    for name, color in (("a.png", (200, 10, 10)), ("b.png", (10, 200, 10))):
        path = gallery / name
        path.write_bytes(image_bytes(color))
        images.append(NewImage(data=path.read_bytes(), path=str(path), mtime=path.stat().st_mtime))
    images.append(NewImage(data=image_bytes((10, 10, 200))))  # an upload: no path
    vectors = np.eye(3, 8, dtype=np.float32)
    ids = [r.id for r in catalog.add_images("photos", images, vectors)]
    try:
        with api_client(settings, catalog=catalog) as client:
            yield client, catalog, {"a": ids[0], "b": ids[1], "upload": ids[2]}, gallery
    finally:
        catalog.close()


def _error_code(response) -> str:  # type: ignore[no-untyped-def]
    return response.json()["error"]["code"]


@pytest.mark.parametrize("route", ["image", "thumbnail"])
def test_untouched_files_and_uploads_are_served(indexed, route: str) -> None:  # type: ignore[no-untyped-def]
    client, _, ids, _ = indexed
    for key in ("a", "upload"):
        r = client.get(f"/v1/items/{ids[key]}/{route}")
        assert r.status_code == 200, r.text
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["content-security-policy"] == "default-src 'none'; sandbox"


@pytest.mark.parametrize("route", ["image", "thumbnail"])
def test_a_symlink_to_a_secret_is_never_served(indexed, route: str) -> None:  # type: ignore[no-untyped-def]
    client, _, ids, gallery = indexed
    photo = gallery / "a.png"
    photo.unlink()
    photo.symlink_to(SECRET)
    r = client.get(f"/v1/items/{ids['a']}/{route}")
    assert r.status_code == 404, r.text
    assert _error_code(r) == "not_found" and "symlink" in r.json()["error"]["message"]
    assert b"root:" not in r.content


@pytest.mark.parametrize("route", ["image", "thumbnail"])
def test_edited_bytes_are_gone(indexed, route: str) -> None:  # type: ignore[no-untyped-def]
    client, _, ids, gallery = indexed
    (gallery / "b.png").write_bytes(image_bytes((1, 2, 3)) + b"<script>alert(1)</script>")
    r = client.get(f"/v1/items/{ids['b']}/{route}")
    assert r.status_code == 410, r.text
    assert _error_code(r) == "gone"


def test_a_touched_file_with_the_same_bytes_is_still_served(indexed) -> None:  # type: ignore[no-untyped-def]
    client, _, ids, gallery = indexed
    photo = gallery / "a.png"
    os.utime(photo, (1_000_000, 1_000_000))  # mtime differs from the record: the sha256 decides
    r = client.get(f"/v1/items/{ids['a']}/image")
    assert r.status_code == 200 and r.content == photo.read_bytes()


def test_a_missing_file_is_404(indexed) -> None:  # type: ignore[no-untyped-def]
    client, _, ids, gallery = indexed
    (gallery / "a.png").unlink()
    assert client.get(f"/v1/items/{ids['a']}/image").status_code == 404


def test_symlinks_inside_the_indexed_root_are_followed_only_when_the_root_is_known(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    target = root / "real" / "x.png"
    target.write_bytes(b"png bytes")
    link = root / "link.png"
    link.symlink_to(target)
    info = target.stat()
    sha = hashlib.sha256(b"png bytes").hexdigest()
    fields = {"size": info.st_size, "mtime": info.st_mtime, "sha256": sha}
    record = ItemRecord(id=1, collection="c", kind="images", path=str(link), **fields)  # type: ignore[arg-type]
    with pytest.raises(NotFound, match="symlink"):
        read_media(record, tmp_path / "media")  # root unknown: no symlink at all

    def rooted_record(path: Path) -> ItemRecord:
        """A record with `root`, as the catalog hands out once it records the indexed folder."""
        return ItemRecord(id=1, collection="c", kind="images", root=str(root), path=str(path), **fields)  # type: ignore[arg-type]

    assert read_media(rooted_record(link), tmp_path / "media") == b"png bytes"
    link.unlink()
    link.symlink_to(SECRET)
    with pytest.raises(NotFound, match="outside"):
        read_media(rooted_record(link), tmp_path / "media")
    target.write_bytes(b"png bytez")  # same size, mtime put back: only the hash tells
    os.utime(target, (info.st_atime, info.st_mtime))
    with pytest.raises(MediaChanged):
        read_media(rooted_record(target), tmp_path / "media")


def test_the_open_walk_follows_no_symlink_even_inside_the_root(tmp_path: Path) -> None:
    """What makes the check race-free: once a path is resolved, it is opened component by component
    without following any link, so a folder swapped for a symlink after the check is refused."""
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "real" / "x.png").write_bytes(b"x")
    (root / "swapped").symlink_to(root / "real", target_is_directory=True)
    (root / "x.png").symlink_to(root / "real" / "x.png")
    with pytest.raises(FileRefused, match="replaced by a symlink"):
        os.close(_walk(root.resolve(), ("swapped", "x.png")))
    with pytest.raises(FileRefused, match="replaced by a symlink"):
        os.close(_walk(root.resolve(), ("x.png",)))
    fd = _walk(root.resolve(), ("real", "x.png"))
    assert os.read(fd, 10) == b"x"
    os.close(fd)


def test_a_fifo_in_place_of_a_photo_does_not_hang_the_server(indexed) -> None:  # type: ignore[no-untyped-def]
    client, _, ids, gallery = indexed
    photo = gallery / "a.png"
    photo.unlink()
    os.mkfifo(photo)
    r = client.get(f"/v1/items/{ids['a']}/image")
    assert r.status_code == 404 and "regular" in r.json()["error"]["message"]


def test_the_image_keeps_byte_ranges_and_validators(indexed) -> None:  # type: ignore[no-untyped-def]
    """Served from the verified bytes in memory, the image still answers what FileResponse did."""
    client, catalog, ids, gallery = indexed
    data = (gallery / "a.png").read_bytes()
    url = f"/v1/items/{ids['a']}/image"
    etag = f'"{catalog.get(ids["a"]).sha256}"'
    whole = client.get(url)
    assert whole.content == data and whole.headers["etag"] == etag and whole.headers["accept-ranges"] == "bytes"
    part = client.get(url, headers={"Range": "bytes=2-9"})
    assert part.status_code == 206 and part.content == data[2:10]
    assert part.headers["content-range"] == f"bytes 2-9/{len(data)}"
    assert client.get(url, headers={"Range": "bytes=-5"}).content == data[-5:]
    assert client.get(url, headers={"Range": "bytes=10-"}).content == data[10:]
    past = client.get(url, headers={"Range": f"bytes={len(data)}-"})
    assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{len(data)}"
    for ignored in ("bytes=0-1,4-5", "bytes=9-2", "lines=1-2"):
        assert client.get(url, headers={"Range": ignored}).content == data, ignored
    assert client.get(url, headers={"Range": "bytes=0-1", "If-Range": '"other"'}).status_code == 200
    assert client.get(url, headers={"If-None-Match": etag}).status_code == 304
