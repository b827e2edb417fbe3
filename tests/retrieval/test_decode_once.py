"""An image is opened with PIL twice per request or file and its pixels decoded once for the model: one
header read (format, size, EXIF orientation and date: `read_header`) whose result is passed along, and
the encoder's decode. A new image is stored with its perceptual hash (near-duplicates, issue 23), which
takes one more open and decode of its own — at a reduced scale for a JPEG (Pillow's draft mode) —
because the encoder may be a remote Triton that decodes on the server; a search takes none. An upload used to be opened four times (the upload check, the encoder, the EXIF
date, the catalog's own probe) and a PNG's pixels decoded twice (its EXIF date was read by loading
it). Counted with the real local encoder, through the API and the bulk indexer."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from PIL import Image, ImageFile

from api import create_app
from api.config import Settings
from indexer.bulk.pipeline import ImageIndexer
from indexer.runtime import open_runtime


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
        assert counts == {"opens": 3, "decodes": 2}  # + the perceptual hash's
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
            assert counts["decodes"] == 2 + 2  # the two distinct images, each once, and each one's hash
            return counts["opens"]

    # Each of the three files is read once (its header); the two distinct images are decoded once each
    # for the model and once each for their perceptual hash (c.jpg, a copy, for neither).
    assert asyncio.run(index()) == 3 + 2 + 2
