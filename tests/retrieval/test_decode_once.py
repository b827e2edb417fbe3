"""An image is opened with PIL twice per request or file and its pixels decoded once: one header read
(format, size, EXIF orientation and date: `read_header`) whose result is passed along, and the
encoder's decode, which a new image's perceptual hash (near-duplicates, issue 23) is taken from too
(issue 34: it used to take an open and a reduced-scale decode of its own; a remote encoder that
decodes on its server still costs one). A search takes no hash. An upload used to be opened four times
(the upload check, the encoder, the EXIF date, the catalog's own probe) and a PNG's pixels decoded
twice (its EXIF date was read by loading it). Counted with the real local encoder, through the API
and the bulk indexer."""

from __future__ import annotations

import asyncio
import hashlib
import io
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image, ImageFile
from sqlalchemy import text

from api import create_app
from api.config import Settings
from demo.duplicate_threshold import encoded, photo_like
from indexer.bulk.pipeline import ImageIndexer
from indexer.bulk.reading import pixels_and_hash
from indexer.domain.perceptual import PHASH_VERSION, phash_of_bytes, phash_or_none
from indexer.runtime import open_runtime
from retrieval.preprocess import ImagePreprocessor, decode_image, read_header


def photo(fmt: str, color: tuple[int, int, int] = (200, 30, 40)) -> bytes:
    """A photo with an EXIF date and a rotation (displayed 30×40)."""
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90°
    exif.get_ifd(0x8769)[0x9003] = "2019:05:04 03:02:01"
    exif.get_ifd(0x8769)[0x9011] = "+08:00"
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(buffer, fmt, exif=exif)
    return buffer.getvalue()


@contextmanager
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Counts of `Image.open` calls and pixel decodes (`ImageFile.load`) while the block runs."""
    counts = {"opens": 0, "decodes": 0}
    real_open, real_load = Image.open, ImageFile.ImageFile.load

    def open_counted(*args: object, **kwargs: object) -> Image.Image:
        counts["opens"] += 1
        return real_open(*args, **kwargs)  # type: ignore[arg-type]

    def load_counted(self: ImageFile.ImageFile) -> object:
        if getattr(self, "_im", None) is None:  # pixels not there yet: this call decodes them
            counts["decodes"] += 1
        return real_load(self)

    with monkeypatch.context() as patch:
        patch.setattr(Image, "open", open_counted)
        patch.setattr(ImageFile.ImageFile, "load", load_counted)
        yield counts


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_an_upload_is_opened_twice_and_decoded_once(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    data = photo(fmt)
    with TestClient(create_app(settings)) as client:  # the real local encoder (the toy model)
        assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        with counted(monkeypatch) as counts:
            added = client.post("/v1/collections/photos/items", files={"file": ("a", data)})
        assert added.status_code == 201, added.text
        assert counts == {"opens": 2, "decodes": 1}  # the pixels and the perceptual hash from one decode
        item = client.get(f"/v1/items/{added.json()['id']}").json()
        # The one header read reached the catalog: size as displayed, the EXIF date.
        assert (item["mime"], item["width"], item["height"]) == (Image.MIME[fmt], 30, 40)
        assert item["taken_at_source"] == "exif"
        assert datetime.fromisoformat(item["taken_at"]) == datetime(2019, 5, 3, 19, 2, 1, tzinfo=UTC)

        with counted(monkeypatch) as counts:
            found = client.post("/v1/search/image", files={"file": ("a", data)}, data={"collection": "photos"})
        assert found.status_code == 200 and counts == {"opens": 2, "decodes": 1}


def test_a_bulk_indexed_file_is_opened_twice_and_decoded_once(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(photo("JPEG"))
    (folder / "b.png").write_bytes(photo("PNG", (20, 90, 200)))
    (folder / "c.jpg").write_bytes(photo("JPEG"))  # the same bytes as a.jpg: not embedded again

    async def index() -> int:
        async with open_runtime(settings) as rt:
            assert rt.service is not None
            with counted(monkeypatch) as counts:
                summary = await ImageIndexer(rt.service, "photos", batch_size=2).run(folder)
            assert summary.added == 2 and summary.duplicates == 1
            assert counts["decodes"] == 2  # the two distinct images, each once: pixels and hash alike
            return counts["opens"]

    # Each of the three files is read once (its header); the two distinct images are decoded once each,
    # for the model and their perceptual hash together (c.jpg, a copy, for neither).
    assert asyncio.run(index()) == 3 + 2


def test_the_hash_from_the_shared_decode_is_the_hash_of_the_bytes(settings: Settings, tmp_path: Path) -> None:
    """Uploads and bulk-indexed files store the value `phash_of_bytes` gives (the backfill's and a remote
    encoder's path), stamped with the hash version, though no second decode took it. The pictures are
    ones whose hash at version 1's reduced scale differs: a hash from any other decode would show."""
    pictures = [
        encoded(photo_like(seed, size), quality=90)
        for seed, size in [(1, (801, 601)), (11, (900, 500)), (14, (1000, 700))]
    ]
    assert all(phash_or_none(decode_image(p, draft=64)) != phash_of_bytes(p) for p in pictures)
    folder = tmp_path / "photos"
    folder.mkdir()
    for position, data in enumerate(pictures[1:]):
        (folder / f"{position}.jpg").write_bytes(data)

    async def stored() -> list[tuple[str, int | None, int | None]]:
        async with open_runtime(settings) as rt:
            assert rt.service is not None and rt.catalog is not None
            rt.service.create("photos", "images")
            await rt.service.writes.add_upload("photos", pictures[0], read_header(pictures[0]))
            await ImageIndexer(rt.service, "photos", batch_size=2).run(folder)
            with rt.catalog.engine.connect() as connection:  # type: ignore[attr-defined]
                rows = connection.execute(text("SELECT sha256, phash, phash_version FROM items ORDER BY id"))
                return [(sha, phash, version) for sha, phash, version in rows]

    expected = {hashlib.sha256(data).hexdigest(): phash_of_bytes(data) for data in pictures}
    rows = asyncio.run(stored())
    assert len(rows) == 3
    for sha, phash, version in rows:
        assert phash is not None and phash == expected[sha] and version == PHASH_VERSION


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "TIFF"])
def test_one_decode_gives_the_encoders_pixels_and_the_hash_of_the_bytes(fmt: str) -> None:
    picture = photo_like(3, (700, 500))
    exif = Image.Exif()
    exif[0x0112] = 8  # rotated: the hash and the pixels both see the picture upright
    data = encoded(picture.convert("I;16") if fmt == "TIFF" else picture, fmt, exif=exif)
    preprocess = ImagePreprocessor(size=64)
    pixels, phash = pixels_and_hash(preprocess, data)
    assert np.array_equal(pixels, preprocess(data)) and phash == phash_of_bytes(data) is not None
    assert pixels_and_hash(preprocess, data, hashed=False)[1] is None
