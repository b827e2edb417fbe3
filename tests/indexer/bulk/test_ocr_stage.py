"""The OCR stage of the bulk pipeline (indexer/bulk/ocr_stage.py): a collection with OCR has every photo
read for text beside its embedding and stored with the item (SQLite and PostgreSQL); one without is
never read; a photo OCR cannot read is an item without text, never a failed file; OCR turned on later
reads the photos indexed before without embedding them again; an engine that cannot load leaves the
items without text rows (a later fill reads them). One test runs the real engine on rendered signs."""

from __future__ import annotations

import asyncio
from pathlib import Path

from indexer.bulk.pipeline import ImageIndexer, IndexSummary
from indexer.service.collections import CollectionService
from indexer.storage.catalog import SqlCatalog
from retrieval.errors import ModelError
from retrieval.fake import FakeEncoder
from retrieval.ocr.reader import OcrReader
from tests.support.indexer_helpers import jpeg, service_for
from tests.support.ocr_fakes import FakeOcrEngine, fake_reader, png_with_text
from tests.support.ocr_pictures import write_pictures

DIM = 16
TEXTS = ["北京烤鸭", "安全出口B", "", "营业时间\n9:00-21:00", "UNREADABLE"]


def _folder(root: Path) -> Path:
    root.mkdir(parents=True)
    for n, text in enumerate(TEXTS):
        (root / f"sign{n}.png").write_bytes(png_with_text(text, seed=n))
    (root / "plain.jpg").write_bytes(jpeg(7))
    return root


def _service(catalog: SqlCatalog, encoder: FakeEncoder, reader: OcrReader | None, ocr: bool) -> CollectionService:
    service = service_for(catalog, encoder)
    service.texts.reader = reader
    service.create("photos", "images")
    if ocr:
        service.texts.set_ocr("photos", True)
    return service


def _run(service: CollectionService, folder: Path) -> IndexSummary:
    return asyncio.run(ImageIndexer(service, "photos", batch_size=2, read_threads=2).run(folder))


def _texts_by_name(catalog: SqlCatalog) -> dict[str, str]:
    states = catalog.file_states("photos")
    found = catalog.texts.texts_for([s.id for s in states.values()])
    return {Path(path).name: found[s.id].text for path, s in states.items() if s.id in found}


def test_a_collection_with_ocr_stores_each_photo_s_text(catalog: SqlCatalog, tmp_path: Path) -> None:
    engine, encoder = FakeOcrEngine(), FakeEncoder(DIM)
    service = _service(catalog, encoder, fake_reader(engine), ocr=True)
    summary = _run(service, _folder(tmp_path / "photos"))
    assert (summary.added, summary.failures, summary.read_for_text) == (6, [], 6)
    assert _texts_by_name(catalog) == {
        "sign0.png": "北京烤鸭",
        "sign1.png": "安全出口B",
        "sign2.png": "",
        "sign3.png": "营业时间\n9:00-21:00",
        "sign4.png": "",  # the engine failed on it: an item without text, not a failed file
        "plain.jpg": "",
    }
    assert engine.calls == 6
    again = _run(service, tmp_path / "photos")
    assert (again.unchanged, again.read_for_text, engine.calls) == (6, 0, 6)  # nothing read twice


def test_a_collection_without_ocr_is_never_read(catalog: SqlCatalog, tmp_path: Path) -> None:
    engine = FakeOcrEngine()
    service = _service(catalog, FakeEncoder(DIM), fake_reader(engine), ocr=False)
    summary = _run(service, _folder(tmp_path / "photos"))
    assert (summary.added, summary.read_for_text, engine.calls) == (6, 0, 0)
    assert _texts_by_name(catalog) == {}


def test_ocr_turned_on_later_reads_indexed_photos_without_embedding_them(catalog: SqlCatalog, tmp_path: Path) -> None:
    engine, encoder = FakeOcrEngine(), FakeEncoder(DIM)
    service = _service(catalog, encoder, fake_reader(engine), ocr=False)
    folder = _folder(tmp_path / "photos")
    _run(service, folder)
    embedded = len(encoder.calls)
    service.texts.set_ocr("photos", True)
    (folder / "new.png").write_bytes(png_with_text("新照片", seed=40))
    summary = _run(service, folder)
    assert (summary.added, summary.unchanged, summary.read_for_text) == (1, 6, 7)
    assert len(encoder.calls) == embedded + 1  # only the new photo went through the encoder
    assert _texts_by_name(catalog)["new.png"] == "新照片" and _texts_by_name(catalog)["sign0.png"] == "北京烤鸭"


def test_an_engine_that_cannot_load_indexes_without_text(catalog: SqlCatalog, tmp_path: Path) -> None:
    def broken() -> FakeOcrEngine:
        raise ModelError("no OCR models")

    service = _service(catalog, FakeEncoder(DIM), OcrReader(broken, threads=1), ocr=True)
    summary = _run(service, _folder(tmp_path / "photos"))
    assert (summary.added, summary.failures, summary.read_for_text) == (6, [], 0)
    assert _texts_by_name(catalog) == {}  # no rows: `cnclip ocr` reads them once the engine loads
    service.texts.reader = fake_reader()
    assert asyncio.run(service.texts.fill("photos")).read == 6


def test_the_real_engine_reads_rendered_signs_into_sql(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "pictures"
    written = write_pictures(folder, photos_without_text=1)
    keep = {"sign-kaoya.jpg", "sign-exit.jpg", "screen-hours.jpg", "photo-00.jpg"}
    for name in set(written) - keep:
        (folder / name).unlink()
    reader = OcrReader(threads=2)
    try:
        service = _service(catalog, FakeEncoder(DIM), reader, ocr=True)
        summary = _run(service, folder)
    finally:
        reader.close()
    assert (summary.added, summary.read_for_text) == (4, 4)
    texts = {name: "".join(text.split()) for name, text in _texts_by_name(catalog).items()}
    assert "北京烤鸭" in texts["sign-kaoya.jpg"] and "安全出口B" in texts["sign-exit.jpg"]
    assert "营业时间" in texts["screen-hours.jpg"] and "9:00-21:00" in texts["screen-hours.jpg"]
    assert "烤鸭" not in texts["photo-00.jpg"]
