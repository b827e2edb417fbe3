"""When photos were taken: EXIF DateTimeOriginal (with or without its offset), the mtime fallback,
uploads, and the backfill of catalogs indexed before taken_at existed (nothing embedded again).
On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import io
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import text

from indexer.bulk.pipeline import ImageIndexer, IndexSummary
from indexer.domain.records import NewImage
from indexer.domain.taken import exif_taken, parse_exif_datetime, taken_of
from indexer.storage.catalog import SqlCatalog
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import random_unit, service_for

DIM = 16
MTIME = 1_600_000_000  # 2020-09-13T12:26:40Z


def photo(seed: int, when: str | None = None, offset: str | None = None, fmt: str = "JPEG") -> bytes:
    exif = Image.Exif()
    if when is not None:
        exif.get_ifd(0x8769)[0x9003] = when
    if offset is not None:
        exif.get_ifd(0x8769)[0x9011] = offset
    buffer = io.BytesIO()
    Image.new("RGB", (16, 12), (seed * 37 % 256, seed * 11 % 256, 90)).save(buffer, fmt, exif=exif.tobytes())
    return buffer.getvalue()


def test_exif_dates_offsets_and_junk(monkeypatch: pytest.MonkeyPatch) -> None:
    assert exif_taken(photo(1, "2019:05:04 03:02:01", "+08:00")) == datetime(2019, 5, 3, 19, 2, 1, tzinfo=UTC)
    assert exif_taken(photo(1, "2019:05:04 03:02:01", "-05:30")) == datetime(2019, 5, 4, 8, 32, 1, tzinfo=UTC)
    assert exif_taken(photo(1, "2019:05:04 03:02:01", "+08:00", fmt="PNG")) == datetime(
        2019, 5, 3, 19, 2, 1, tzinfo=UTC
    )
    assert exif_taken(photo(1, "2019:05:04 03:02:01", "+08:00", fmt="WEBP")) == datetime(
        2019, 5, 3, 19, 2, 1, tzinfo=UTC
    )
    # No offset: the camera's wall clock, in the indexing process's time zone.
    monkeypatch.setenv("TZ", "Asia/Shanghai")
    import time

    time.tzset()
    try:
        assert exif_taken(photo(1, "2019:05:04 03:02:01")) == datetime(2019, 5, 3, 19, 2, 1, tzinfo=UTC)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    for junk in [
        "0000:00:00 00:00:00",
        "    :  :     :  :  ",
        "2019-05-04",
        "1700:01:01 00:00:00",
        "2999:01:01 00:00:00",
    ]:
        assert exif_taken(photo(2, junk)) is None, junk
    assert parse_exif_datetime("2019:05:04 03:02:01", "+99:00") is not None  # a bad offset is ignored, not the date
    assert exif_taken(photo(3)) is None and exif_taken(b"not an image") is None
    assert taken_of(photo(3), MTIME) == (datetime.fromtimestamp(MTIME, UTC), "mtime")
    moment, source = taken_of(photo(3), None)
    assert source == "upload" and abs(moment - datetime.now(UTC)) < timedelta(seconds=5)


class CountingEncoder(FakeEncoder):
    def __init__(self) -> None:
        super().__init__(DIM)
        self.images = 0

    async def embed_images(self, images):  # type: ignore[no-untyped-def]
        self.images += len(images)
        return await super().embed_images(images)


def run(catalog: SqlCatalog, encoder: FakeEncoder, folder: Path, **kwargs: object) -> IndexSummary:
    indexer = ImageIndexer(service_for(catalog, encoder), "photos", batch_size=4, read_threads=2)
    return asyncio.run(indexer.run(folder, **kwargs))  # type: ignore[arg-type]


def by_name(catalog: SqlCatalog) -> dict[str, tuple[datetime | None, str | None]]:
    ids = [s.id for s in catalog.file_states("photos").values()]
    return {Path(r.path or "").name: (r.taken_at, r.taken_source) for r in catalog.get_many(ids)}


def test_indexing_dates_files_and_backfills_old_rows_without_embedding(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "exif.jpg").write_bytes(photo(1, "2018:07:01 10:00:00", "+00:00"))
    (folder / "plain.jpg").write_bytes(photo(2))
    (folder / "junk.jpg").write_bytes(photo(3, "0000:00:00 00:00:00"))
    for name in ("exif.jpg", "plain.jpg", "junk.jpg"):
        os.utime(folder / name, (MTIME, MTIME))
    encoder = CountingEncoder()
    assert run(catalog, encoder, folder).added == 3
    mtime = datetime.fromtimestamp(MTIME, UTC)
    expected = {
        "exif.jpg": (datetime(2018, 7, 1, 10, tzinfo=UTC), "exif"),
        "plain.jpg": (mtime, "mtime"),
        "junk.jpg": (mtime, "mtime"),
    }
    assert by_name(catalog) == expected

    # A catalog from before revision 0003: folder files have no date.
    with catalog.engine.begin() as connection:
        connection.execute(text("UPDATE items SET taken_at = NULL, taken_source = NULL"))
    assert set(by_name(catalog).values()) == {(None, None)}
    dry = run(catalog, encoder, folder, dry_run=True)
    assert (dry.would_date, dry.would_index) == (3, 0)
    assert set(by_name(catalog).values()) == {(None, None)}  # a dry run writes nothing
    summary = run(catalog, encoder, folder)
    assert (summary.dated, summary.unchanged, summary.embedded) == (3, 3, 0)
    assert encoder.images == 3  # only the first run embedded
    assert by_name(catalog) == expected
    assert run(catalog, encoder, folder).dated == 0  # incremental: dated rows are not read again
    assert run(catalog, encoder, folder, dry_run=True).would_date == 0


def test_uploads_get_their_exif_date_or_their_upload_time(catalog: SqlCatalog) -> None:
    service = service_for(catalog, FakeEncoder(DIM))
    service.create("photos", "images")
    before = datetime.now(UTC)
    ids = [
        r.id
        for r in service.writes.add_images(
            "photos", [NewImage(photo(1, "2017:02:03 04:05:06", "+01:00")), NewImage(photo(2))], random_unit(2, DIM)
        )
    ]
    dated, undated = catalog.get_many(ids)
    assert (dated.taken_at, dated.taken_source) == (datetime(2017, 2, 3, 3, 5, 6, tzinfo=UTC), "exif")
    assert undated.taken_source == "upload" and undated.taken_at is not None
    assert before - timedelta(seconds=1) <= undated.taken_at <= datetime.now(UTC) + timedelta(seconds=1)
