"""A watched folder of a collection with OCR (docs/ocr.md): the photos of its first pass and those that
arrive later are read for text and kept with their items; a renamed photo keeps its item and its text."""

from __future__ import annotations

import asyncio
from pathlib import Path

from indexer.storage.catalog import SqlCatalog
from indexer.watch.watcher import WatchOptions
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import service_for
from tests.support.ocr_fakes import FakeOcrEngine, fake_reader, png_with_text
from tests.support.watching import until, watching

FAST = WatchOptions(quiet_s=0.2, rescan_interval_s=3600, poll_interval_s=0.2)


def test_a_watched_folder_reads_the_text_of_its_photos(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.png").write_bytes(png_with_text("北京烤鸭", seed=1))
    service = service_for(catalog, FakeEncoder(dim=16))
    engine = FakeOcrEngine()
    service.texts.reader = fake_reader(engine)
    service.create("photos", "images")
    service.texts.set_ocr("photos", True)

    def text_of(name: str) -> str | None:
        state = catalog.file_states("photos").get(str(folder / name))
        found = catalog.texts.texts_for([state.id]) if state is not None else {}
        return found[state.id].text if state is not None and state.id in found else None

    async def scenario() -> None:
        async with watching(service, folder, FAST) as w:
            assert w.passes[0][1].read_for_text == 1 and text_of("a.png") == "北京烤鸭"
            (folder / "b.png").write_bytes(png_with_text("安全出口B", seed=2))
            await until(lambda: text_of("b.png") == "安全出口B", 10)
            item = w.rows()[str(folder / "a.png")].id
            (folder / "a.png").rename(folder / "renamed.png")
            await until(lambda: str(folder / "renamed.png") in w.rows(), 10)
            assert w.rows()[str(folder / "renamed.png")].id == item and text_of("renamed.png") == "北京烤鸭"
        assert engine.calls == 2  # the rename read nothing again

    asyncio.run(scenario())
