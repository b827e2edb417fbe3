"""Where a bulk run's time goes (`IndexSummary.stages`), and the local encoder fed pixels decoded by the
reader threads: the same items, failures and vectors as when it decoded the bytes itself."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from indexer.bulk import pipeline, stage_clock
from indexer.bulk.pipeline import ImageIndexer
from indexer.bulk.stage_clock import StageClock
from indexer.storage.catalog import SqlCatalog
from retrieval.config import RuntimeSettings
from retrieval.encoder import LocalEncoder
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import jpeg, png, service_for


class FakeTime:
    """A perf_counter the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(stage_clock, "time", SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


def test_a_stage_timed_inside_another_is_not_counted_twice(clock_time: FakeTime) -> None:
    clock = StageClock()
    with clock.timing("read"):
        clock_time.now += 1.0  # reading
        with clock.timing("decode"):
            clock_time.now += 3.0  # decoding, inside the read of the same file
        clock_time.now += 0.5
    assert (clock.times.read_s, clock.times.decode_s) == (1.5, 3.0)


def test_shared_work_counts_the_time_any_batch_was_in_it_not_each_batch(clock_time: FakeTime) -> None:
    clock = StageClock()
    first, second = clock.sharing("encode"), clock.sharing("encode")
    first.__enter__()
    clock_time.now += 2.0
    second.__enter__()  # a second batch queued in the encoder: its time is not the encoder's twice
    clock_time.now += 1.0
    first.__exit__(None, None, None)
    clock_time.now += 2.0
    second.__exit__(None, None, None)
    clock_time.now += 10.0  # idle: not counted
    with clock.sharing("encode"):
        clock_time.now += 0.5
    assert clock.times.encode_s == 5.5


def write_folder(folder: Path) -> Path:
    folder.mkdir()
    for i in range(9):
        (folder / f"p{i}.jpg").write_bytes(jpeg(i, size=(64 + 8 * i, 48)))
    (folder / "flat.png").write_bytes(png(3))
    (folder / "copy.jpg").write_bytes(jpeg(2, size=(80, 48)))  # the bytes of p2.jpg
    whole = jpeg(50, size=(200, 150))
    (folder / "cut.jpg").write_bytes(whole[: len(whole) // 2])  # its header reads, its pixels do not
    return folder


async def index_with(
    catalog: SqlCatalog, encoder: Any, folder: Path, spy: dict[str, np.ndarray], collection: str = "photos"
) -> tuple[pipeline.IndexSummary, float]:
    """Index `folder` into a fresh `collection`; `spy` gets the vector committed for each path."""
    service = service_for(catalog, encoder)
    add_images = service.writes.add_images

    def recording(name: str, images: list[Any], vectors: np.ndarray, **options: Any) -> Any:
        spy.update({image.path: vector for image, vector in zip(images, vectors, strict=True)})
        return add_images(name, images, vectors, **options)

    service.writes.add_images = recording  # type: ignore[method-assign,assignment]
    indexer = ImageIndexer(service, collection, batch_size=4, read_threads=2)
    started = time.perf_counter()
    summary = await indexer.run(folder)
    return summary, time.perf_counter() - started


def test_reader_decoded_pixels_give_what_the_encoder_gave_from_bytes(
    catalog: SqlCatalog, tmp_path: Path, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_folder(tmp_path / "photos")
    encoder = LocalEncoder(RuntimeSettings(model_dir=toy_model_dir))
    sent: list[str] = []
    embed_pixels, embed_images = encoder.embed_pixels, encoder.embed_images

    async def pixels(batch: np.ndarray) -> np.ndarray:
        sent.append("pixels")
        return await embed_pixels(batch)

    async def images(batch: Any) -> np.ndarray:
        sent.append("bytes")
        return await embed_images(batch)

    monkeypatch.setattr(encoder, "embed_pixels", pixels)
    monkeypatch.setattr(encoder, "embed_images", images)
    decoded: dict[str, np.ndarray] = {}
    from_bytes: dict[str, np.ndarray] = {}

    async def both_ways() -> tuple[pipeline.IndexSummary, float, pipeline.IndexSummary]:
        await encoder.start()  # one event loop: the encoder's batchers live in it
        try:
            summary, wall = await index_with(catalog, encoder, folder, decoded)
            assert set(sent) == {"pixels"}  # the readers decoded every file the encoder got
            # As before the readers decoded: the encoder handed the bytes, into another collection.
            with monkeypatch.context() as before:
                before.setattr(pipeline, "pixel_decoder", lambda encoder, clock: None)
                old, _ = await index_with(catalog, encoder, folder, from_bytes, "before")
            assert "bytes" in sent
            return summary, wall, old
        finally:
            await encoder.close()

    summary, wall, old = asyncio.run(asyncio.wait_for(both_ways(), 120))
    assert (
        (summary.added, summary.duplicates, summary.embedded)
        == (old.added, old.duplicates, old.embedded)
        == (
            10,
            1,
            10,
        )
    )
    assert summary.failures == old.failures and [Path(p).name for p, _ in summary.failures] == ["cut.jpg"]
    assert decoded.keys() == from_bytes.keys()
    for path, vector in decoded.items():
        np.testing.assert_allclose(vector, from_bytes[path], atol=1e-5)

    stages = asdict(summary.stages)
    assert set(stages) == {
        "walk_s",
        "read_s",
        "decode_s",
        "core_wait_s",
        "encode_s",
        "commit_s",
        "vectors_s",
        "ocr_s",
        "wall_s",
    }
    assert all(seconds >= 0 for seconds in stages.values())
    assert summary.stages.decode_s > 0 and summary.stages.encode_s > 0 and summary.stages.commit_s > 0
    assert summary.stages.ocr_s == 0  # no OCR on this collection
    assert summary.stages.wall_s == summary.seconds and 0 < summary.stages.wall_s <= wall
    assert wall - summary.stages.wall_s < 0.05  # the run's own clock, around all of it
    assert old.stages.decode_s == 0 and old.stages.encode_s > 0  # the encoder decoded: inside encode_s


def test_an_encoder_that_takes_bytes_gets_bytes(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "photos")
    encoder = FakeEncoder(16)
    vectors: dict[str, np.ndarray] = {}
    summary, _ = asyncio.run(index_with(catalog, encoder, folder, vectors))
    assert summary.added == 11  # the fake hashes bytes: the cut JPEG is a fine image to it
    for path, vector in vectors.items():
        np.testing.assert_array_equal(vector, encoder.embed_images_sync([Path(path).read_bytes()])[0])
    assert summary.stages.decode_s == 0 and summary.stages.read_s > 0


def test_every_decode_in_the_reader_threads_holds_a_core_permit(
    catalog: SqlCatalog, tmp_path: Path, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding and the encoder's sessions share the encoder's `CoreGate`: never more threads at work
    than the cores, however many reader threads there are."""
    folder = write_folder(tmp_path / "photos")
    encoder = LocalEncoder(RuntimeSettings(model_dir=toy_model_dir))
    gate = encoder.core_gate
    hold = gate.hold
    holders: list[tuple[str, int]] = []

    def recording(threads: int) -> Any:
        holders.append((threading.current_thread().name, threads))
        return hold(threads)

    monkeypatch.setattr(gate, "hold", recording)

    async def index() -> pipeline.IndexSummary:
        await encoder.start()
        try:
            return (await index_with(catalog, encoder, folder, {}))[0]
        finally:
            await encoder.close()

    summary = asyncio.run(asyncio.wait_for(index(), 120))
    decodes = [threads for name, threads in holders if name.startswith("cnclip-read")]
    # The 11 files of new bytes (10 embedded, the cut one refused), one permit each (the copy too,
    # only when two readers race on its bytes: needs_hash allows that).
    assert set(decodes) == {1} and 11 <= len(decodes) <= 12 and summary.stages.decode_s > 0
    assert gate.peak <= gate.cores
