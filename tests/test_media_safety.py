"""Media are served only while they are the bytes that were indexed, never through a symlink out of
the indexed folder (issue 15): a photo replaced by a link to /etc/passwd is not served (404), edited
bytes are 410, a `touch` that keeps the bytes still serves; thumbnails follow the same rule."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from api.config import Settings
from indexer.catalog import SqlCatalog
from indexer.media_check import MediaChanged, verified_media_path
from indexer.types import ItemRecord, NewImage
from retrieval.errors import NotFound
from tests.api_helpers import api_client, image_bytes, open_test_catalog

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
    record = ItemRecord(id=1, collection="c", kind="images", path=str(link), size=info.st_size, mtime=info.st_mtime)
    with pytest.raises(NotFound, match="symlink"):
        verified_media_path(record, tmp_path / "media")  # root unknown: no symlink at all

    def rooted_record(**fields: object) -> ItemRecord:
        """A record with `root`, as the catalog hands out once it records the indexed folder."""
        return ItemRecord(id=1, collection="c", kind="images", root=str(root), **fields)  # type: ignore[arg-type]

    rooted = rooted_record(path=str(link), size=info.st_size, mtime=info.st_mtime)
    assert verified_media_path(rooted, tmp_path / "media") == target.resolve()
    link.unlink()
    link.symlink_to(SECRET)
    with pytest.raises(NotFound, match="outside"):
        verified_media_path(rooted, tmp_path / "media")
    with pytest.raises(MediaChanged):
        target.write_bytes(b"other bytes")
        verified_media_path(
            rooted_record(path=str(target), size=9, mtime=info.st_mtime, sha256="0" * 64),
            tmp_path / "media",
        )
