"""Recognition's use cases (indexer/service/texts.py): `cnclip ocr`'s fill reads what has no text yet,
resumably (a limit, a stop), reports files gone without storing anything for them; uploads to a
collection with OCR are read beside their embedding; only image collections have OCR; a model
migration keeps every text (it is per item, not per model). On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from indexer.bulk.pipeline import ImageIndexer
from indexer.service.collections import CollectionService
from indexer.service.migration import MigrateOptions
from indexer.storage.catalog import SqlCatalog
from retrieval.errors import InvalidInput
from retrieval.fake import FakeEncoder
from retrieval.preprocess import read_header
from tests.support.indexer_helpers import service_for
from tests.support.next_model import NewModel
from tests.support.ocr_fakes import FakeOcrEngine, fake_reader, png_with_text

DIM = 16


async def _indexed(catalog: SqlCatalog, folder: Path, count: int) -> tuple[CollectionService, FakeOcrEngine]:
    """`count` photos with text indexed without OCR, then a reader handed to the service."""
    folder.mkdir(parents=True)
    for n in range(count):
        (folder / f"p{n}.png").write_bytes(png_with_text(f"第{n}张", seed=n))
    encoder = FakeEncoder(DIM)
    await encoder.start()
    service = service_for(catalog, encoder)
    service.create("photos", "images")
    await ImageIndexer(service, "photos", batch_size=4, read_threads=1).run(folder)
    engine = FakeOcrEngine()
    service.texts.reader = fake_reader(engine)
    return service, engine


def test_fill_is_resumable_and_turns_ocr_on(catalog: SqlCatalog, tmp_path: Path) -> None:
    async def scenario() -> None:
        service, engine = await _indexed(catalog, tmp_path / "photos", 9)
        first = await service.texts.fill("photos", limit=3)
        assert (first.items, first.missing, first.read, first.with_text) == (9, 9, 3, 3)
        assert catalog.collection("photos").ocr is True
        stop = asyncio.Event()
        seen: list[int] = []

        def stop_after_a_batch(fill) -> None:  # type: ignore[no-untyped-def]
            seen.append(fill.read)
            if fill.read > 0:
                stop.set()

        service.texts.reader.threads = 1  # type: ignore[union-attr]  # batches of 4
        second = await service.texts.fill("photos", stop=stop, on_progress=stop_after_a_batch)
        assert (second.missing, second.read, second.interrupted) == (6, 4, True)
        last = await service.texts.fill("photos")
        assert (last.missing, last.read, last.interrupted) == (2, 2, False)
        assert (await service.texts.fill("photos")).read == 0
        assert engine.calls == 9  # every photo read once
        assert catalog.texts.text_counts("photos") == (9, 9)

    asyncio.run(scenario())


def test_fill_reports_files_gone_and_stores_nothing_for_them(catalog: SqlCatalog, tmp_path: Path) -> None:
    async def scenario() -> None:
        service, _ = await _indexed(catalog, tmp_path / "photos", 3)
        (tmp_path / "photos" / "p1.png").unlink()
        fill = await service.texts.fill("photos")
        assert (fill.read, len(fill.unreadable)) == (2, 1)
        gone = catalog.file_states("photos")[str(tmp_path / "photos" / "p1.png")].id
        assert fill.unreadable[0][0] == gone
        assert catalog.texts.texts_missing("photos", 0, 10) == [gone]  # a later fill tries again
        assert fill.as_json()["unreadable"] == 1

    asyncio.run(scenario())


def test_uploads_to_a_collection_with_ocr_are_read(catalog: SqlCatalog) -> None:
    async def scenario() -> None:
        encoder = FakeEncoder(DIM)
        await encoder.start()
        service = service_for(catalog, encoder)
        engine = FakeOcrEngine()
        service.texts.reader = fake_reader(engine)
        service.create("signs", "images")
        service.create("plain", "images")
        service.texts.set_ocr("signs", True)
        data = png_with_text("会议室 3F", seed=1)
        read = await service.writes.add_upload("signs", data, read_header(data))
        unread = await service.writes.add_upload("plain", data, read_header(data))
        texts = catalog.texts.texts_for([read.id, unread.id])
        assert set(texts) == {read.id} and texts[read.id].text == "会议室 3F" and engine.calls == 1

    asyncio.run(scenario())


def test_only_image_collections_have_ocr(catalog: SqlCatalog) -> None:
    service = service_for(catalog, FakeEncoder(DIM))
    service.create("captions", "texts")
    with pytest.raises(InvalidInput, match="only image collections"):
        service.texts.set_ocr("captions", True)


def test_a_model_migration_keeps_the_text(catalog: SqlCatalog, tmp_path: Path) -> None:
    async def scenario() -> None:
        service, _ = await _indexed(catalog, tmp_path / "photos", 4)
        await service.texts.fill("photos")
        before = catalog.texts.texts_for([state.id for state in catalog.file_states("photos").values()])
        report = await service.migration.migrate("photos", NewModel(DIM), MigrateOptions(batch=2))
        assert report.swapped and catalog.collection("photos").model != "fake"
        after = catalog.texts.texts_for(list(before))
        assert after == before and len(after) == 4
        assert catalog.collection("photos").ocr is True

    asyncio.run(scenario())
