"""The composition root (indexer/runtime.py): it opens what a caller asks for and nothing more, closes
what it opened (never what was injected), and runs background tasks from open to close — started
once it is open, cancelled and awaited before the encoders and the catalog they use are closed; it hands
the service its OCR reader, loaded at start where the catalog has a collection with OCR."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from api.config import Settings
from indexer.domain.records import NewImage
from indexer.runtime import model_encoders, open_runtime
from retrieval.encoder import LocalEncoder
from retrieval.errors import EncoderUnavailable, ModelError
from retrieval.fake import FakeEncoder
from retrieval.preprocess import read_header
from tests.support.indexer_helpers import jpeg
from tests.support.ocr_fakes import FakeOcrEngine, png_with_text

DIM = 16


def test_background_tasks_run_from_open_to_close_and_stop_before_the_encoder(settings: Settings) -> None:
    events: list[str] = []
    encoder = FakeEncoder(DIM)

    async def watcher(name: str) -> None:
        events.append(f"{name} started")
        try:
            await asyncio.Event().wait()  # runs until cancelled
        finally:
            # Cancelled first: the encoder it uses is still warm while it winds down.
            events.append(f"{name} stopped, encoder ready={encoder.ready}")

    async def scenario() -> None:
        runtime = open_runtime(settings, catalog=False, encoder=encoder)
        async with runtime as rt:
            rt.run_in_background("early", lambda: watcher("early"))
            await asyncio.sleep(0)
            assert events == ["early started"]
            rt.run_in_background("late", lambda: watcher("late"))
            with pytest.raises(ValueError, match="runs already"):
                rt.run_in_background("late", lambda: watcher("again"))
            await asyncio.sleep(0)
            assert sorted(rt.background) == ["early", "late"] and events[-1] == "late started"
        assert sorted(events[2:]) == ["early stopped, encoder ready=True", "late stopped, encoder ready=True"]

    asyncio.run(scenario())
    assert encoder.ready  # injected: the caller's to close


def test_a_failing_background_task_is_logged_and_the_rest_runs_on(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken() -> None:
        raise RuntimeError("the folder went away")

    async def scenario() -> bool:
        async with open_runtime(settings, catalog=False, encoder=FakeEncoder(DIM)) as rt:
            rt.run_in_background("broken", broken)
            rt.run_in_background("steady", lambda: asyncio.Event().wait())
            await asyncio.sleep(0.05)
            return rt.background["steady"].done()

    with caplog.at_level(logging.ERROR, logger="indexer.runtime"):
        assert asyncio.run(scenario()) is False
    assert "background task broken failed" in caplog.text and "the folder went away" in caplog.text


def test_each_caller_gets_what_it_asks_for(settings: Settings) -> None:
    async def scenario() -> None:
        # The worker: a model, no catalog (and so no service).
        async with open_runtime(settings, catalog=False, warm=False) as rt:
            assert rt.catalog is None and rt.service is None and not rt.encoder.ready
            await rt.start_encoders()
            created = rt.encoder
            assert created.ready and rt.zeroshot is not None
        assert not created.ready  # created here: closed here
        # `cnclip stats`: a catalog and its service, no model (reads work; searches say why not).
        async with open_runtime(settings, encoder=False) as rt:
            assert rt.service is not None and rt.encoders == {} and rt.zeroshot is None
            assert rt.service.list_all() == []
            with pytest.raises(EncoderUnavailable):
                rt.encoder  # noqa: B018 - the property raises
            with pytest.raises(EncoderUnavailable, match="runs no model"):
                rt.service.create("photos", "images")  # a collection is made for a model

    asyncio.run(scenario())


def test_a_writer_opens_no_vector_store_and_a_server_opens_every_one(settings: Settings) -> None:
    encoder = FakeEncoder(DIM)

    async def scenario() -> None:
        async with open_runtime(settings, encoder=encoder) as rt:
            assert rt.service is not None and rt.catalog is not None
            rt.service.create("photos", "images")
            vectors = np.asarray(await encoder.embed_images([jpeg(1)]))
            rt.service.writes.add_images("photos", [NewImage(data=jpeg(1))], vectors)
            photos = rt.catalog.collection("photos").id
            assert rt.catalog.stores.held(photos) is None  # type: ignore[attr-defined]  # SqlCatalog's
        async with open_runtime(settings, encoder=encoder, stores="now") as rt:
            assert rt.catalog is not None
            assert rt.catalog.stores.held(photos) is not None  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_an_engine_that_cannot_load_is_one_line_at_start(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    loads: list[str] = []

    def broken(*args: object, **kwargs: object) -> FakeOcrEngine:
        loads.append("tried")
        raise ModelError("no OCR models here")

    monkeypatch.setattr("indexer.runtime.open_rapidocr", broken)
    data = png_with_text("北京烤鸭")

    async def scenario() -> None:
        async with open_runtime(settings, encoder=FakeEncoder(), warm=False) as rt:
            assert rt.service is not None
            rt.service.create("signs", "images")
            rt.service.texts.set_ocr("signs", True)
            rt.service.create("plain", "images")
        assert loads == []  # a cold process never loads it
        with caplog.at_level(logging.WARNING, logger="retrieval.ocr.reader"):
            async with open_runtime(settings, encoder=FakeEncoder(), warm=True) as rt:
                assert rt.service is not None
                assert loads == ["tried"]  # at start: the catalog has a collection with OCR
                for name in ("signs", "plain"):
                    added = await rt.service.writes.add_upload(name, data, read_header(data))
                    assert added.created
        lines = [r.getMessage() for r in caplog.records if r.name == "retrieval.ocr.reader"]
        assert len(lines) == 1 and "no OCR models here" in lines[0]
        assert loads == ["tried"]

    asyncio.run(scenario())


def test_the_encoders_of_several_models_share_one_core_gate(settings: Settings) -> None:
    """Two models in one process (CNCLIP_MODEL_DIRS): their streams and decode workers together stay
    within the cores, not each model within all of them."""
    encoders = model_encoders(settings.model_copy(update={"model_dirs": [settings.model_dir]}))
    assert len(encoders) == 2 and all(isinstance(e, LocalEncoder) for e in encoders)
    assert encoders[0].core_gate is encoders[1].core_gate  # type: ignore[attr-defined]
