"""A same-size rewrite with the old mtime put back is served as 410 "re-index its folder"
(tests/indexer/storage/test_media_race.py); re-indexing must then notice it: st_ctime moved after the row was
recorded, so the file is read again and re-embedded, although its size and mtime are as recorded.
A file nobody touched is still not read."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import time
from pathlib import Path

import pytest
from PIL import Image

from indexer.bulk import pipeline
from indexer.bulk.pipeline import ImageIndexer, IndexSummary
from indexer.bulk.reading import read_file
from indexer.bulk.sources import SourceEntry
from indexer.domain.records import FileState
from indexer.storage.catalog import SqlCatalog
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import open_test_catalog, service_for

DIM = 16


def _bmp(value: int) -> bytes:

    buffer = io.BytesIO()
    Image.new("RGB", (16, 12), (value, 40, 90)).save(buffer, "BMP")
    return buffer.getvalue()


def _run(catalog: SqlCatalog, encoder: FakeEncoder, root: Path) -> IndexSummary:
    indexer = ImageIndexer(service_for(catalog, encoder), "photos", batch_size=4)
    return asyncio.run(indexer.run(root))


def test_a_same_size_rewrite_with_the_old_mtime_is_reindexed(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []

    def counted(entry: SourceEntry, state: FileState | None, *args: object) -> object:
        reads.append(entry.path.name)
        return read_file(entry, state, *args)

    monkeypatch.setattr(pipeline, "read_file", counted)
    root = tmp_path / "photos"
    root.mkdir()
    for n in range(3):
        (root / f"p{n}.bmp").write_bytes(_bmp(n * 50))
    catalog = open_test_catalog(tmp_path / "data", database_url)
    try:
        encoder = FakeEncoder(DIM)
        assert _run(catalog, encoder, root).added == 3
        reads.clear()
        again = _run(catalog, encoder, root)
        assert (again.unchanged, again.added, again.changed) == (3, 0, 0) and reads == []  # not even read

        time.sleep(0.05)  # the rewrite comes after the rows were recorded
        photo = root / "p1.bmp"
        before = photo.stat()
        photo.write_bytes(_bmp(250))  # same size (uncompressed), other bytes
        os.utime(photo, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert (photo.stat().st_size, photo.stat().st_mtime) == (before.st_size, before.st_mtime)

        rerun = _run(catalog, encoder, root)
        assert (rerun.changed, rerun.unchanged, rerun.added) == (1, 2, 0) and reads == ["p1.bmp"]
        assert hashlib.sha256(_bmp(250)).hexdigest() == catalog.file_states("photos")[str(photo)].sha256
        reads.clear()
        last = _run(catalog, encoder, root)
        assert (last.unchanged, last.changed) == (3, 0) and reads == []
    finally:
        catalog.close()
