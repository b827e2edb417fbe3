"""Issue 29 item 8: a server that meets a swap to a model it does not hold (not in CNCLIP_MODEL_DIRS)
loads it from the directory the migration recorded, answers with the previous generation meanwhile,
then moves — searches never fail. A recorded directory whose files changed is refused (fingerprint),
and the previous generation goes on answering; 503 only once that is gone too."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.config import Settings
from indexer.domain.paging import PageRequest
from indexer.runtime import model_encoder, open_runtime
from indexer.service.collections import CollectionService
from indexer.service.migration import MigrateOptions
from retrieval.errors import EncoderUnavailable
from retrieval.preprocess import read_header
from retrieval.toolchain.toy_model import write_toy_model
from tests.support.api_helpers import open_test_catalog
from tests.support.cli_server import running_server, searches_meanwhile
from tests.support.indexer_helpers import cli_env, jpeg, start_cli, write_images


async def _migrate_beside(settings: Settings, model_dir: Path) -> None:
    """`cnclip migrate --model DIR` as another process does it: its own catalog, its own encoder."""
    catalog = open_test_catalog(settings)
    encoder = model_encoder(settings, model_dir)
    try:
        migrator = CollectionService(catalog, None)
        report = await migrator.migration.migrate("photos", encoder, MigrateOptions(), model_dir=str(model_dir))
        assert report.swapped
    finally:
        await encoder.close()
        catalog.close()


async def _until(check: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_a_server_loads_the_model_a_collection_swapped_to_and_answers_the_old_generation_meanwhile(
    settings: Settings, next_model: Path
) -> None:
    async def scenario() -> None:
        async with open_runtime(settings) as rt:
            service = rt.service
            assert service is not None and len(rt.encoders) == 1
            service.create("photos", "images")
            for n in range(4):
                await service.writes.add_upload("photos", jpeg(n), read_header(jpeg(n)))
            await _migrate_beside(settings, next_model)
            # The first search after the swap: the previous generation (32-d, the model held) answers.
            page = await service.search.text("照片", "photos", PageRequest(k=3))
            assert page.collection.dim == 32 and len(page.results) == 3
            await _until(lambda: any(e.dim == 16 for e in service.migration.encoders.values()))
            page = await service.search.image(jpeg(2), "photos", "images", PageRequest(k=1))
            assert page.collection.dim == 16 and page.results[0].score > 0.99  # the new model embedded it
            added = await service.writes.add_upload("photos", jpeg(9), read_header(jpeg(9)))
            assert service.catalog.vector(added.id).shape == (16,)

    asyncio.run(scenario())


def test_a_recorded_directory_whose_files_changed_is_refused_and_the_old_generation_answers(
    settings: Settings, tmp_path: Path
) -> None:
    moved = tmp_path / "toy-moved"
    moved.mkdir()
    write_toy_model(moved, dim=16, seed=7, name="toy-moved", int8=False)

    async def scenario() -> None:
        async with open_runtime(settings) as rt:
            service = rt.service
            assert service is not None and service.migration.model_loader is not None
            service.create("photos", "images")
            for n in range(4):
                await service.writes.add_upload("photos", jpeg(n), read_header(jpeg(n)))
            await _migrate_beside(settings, moved)
            # Hostile: the directory now holds another model (its files rewritten: another fingerprint).
            write_toy_model(moved, dim=16, seed=8, name="toy-moved", int8=False)
            page = await service.search.text("照片", "photos", PageRequest(k=3))
            assert page.collection.dim == 32 and len(page.results) == 3
            loader = service.migration.model_loader
            new_model = service.catalog.collection("photos").model
            await _until(lambda: loader.request(new_model, 16) == "failed")
            assert not any(e.dim == 16 for e in service.migration.encoders.values())
            for _ in range(5):  # still answered, by the previous generation
                page = await service.search.text("照片", "photos", PageRequest(k=3))
                assert page.collection.dim == 32 and len(page.results) == 3
            with pytest.raises(EncoderUnavailable):  # a write waits for the model (503), not a 422
                await service.writes.add_upload("photos", jpeg(9), read_header(jpeg(9)))
            # The previous generation dropped too: now, and only now, searches answer 503.
            catalog = open_test_catalog(settings)
            try:
                CollectionService(catalog, None).migration.drop_generation("photos", "previous")
            finally:
                catalog.close()
            with pytest.raises(EncoderUnavailable):
                await service.search.text("照片", "photos", PageRequest(k=3))

    asyncio.run(scenario())


def test_a_migration_beside_a_server_without_model_dirs_fails_no_search(
    tmp_path: Path, toy_model_dir: Path, next_model: Path
) -> None:
    """Real processes: `cnclip serve` with only CNCLIP_MODEL_DIR, `cnclip migrate --model DIR` beside it.
    Before: after the swap about half the searches answered 422 until the server restarted."""
    env = cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'c.db'}", toy_model_dir)
    write_images(tmp_path / "photos", 12)
    process = start_cli(["index", str(tmp_path / "photos"), "--collection", "photos"], env)
    output, _ = process.communicate(timeout=180)
    assert process.returncode == 0, output
    with running_server({**env, "CNCLIP_SYNC_INTERVAL_S": "0.1"}) as base:
        with searches_meanwhile(base) as answers:
            process = start_cli(["migrate", "-c", "photos", "--model", str(next_model), "--batch", "4"], env)
            output, _ = process.communicate(timeout=180)
            assert process.returncode == 0, output
            # The server moves once it has loaded the model: an upload (which needs it) goes in then.
            deadline = time.monotonic() + 90
            while True:
                r = httpx.post(
                    base + "/v1/collections/photos/items",
                    files={"file": ("new.jpg", jpeg(40), "image/jpeg")},
                    timeout=30,
                )
                if r.status_code == 201:
                    break
                assert r.status_code == 503, r.text  # loading: retry, never a 422
                assert time.monotonic() < deadline
                time.sleep(0.2)
            seen = len(answers)
            print(f"searches until the server moved: {seen}")
            while len(answers) < seen + 10:  # searches after the move, answered by the new model
                assert time.monotonic() < deadline + 30
                time.sleep(0.05)
        failed = [a for a in answers if a[0] != 200 or a[1] == 0]
        print(f"searches: {len(answers)}, not 200 with results: {len(failed)}")
        assert not failed and len(answers) > 20, failed[:5]
        listed = httpx.get(base + "/v1/collections/photos").json()
        assert listed["dim"] == 16 and listed["items"] == 13


@pytest.mark.parametrize("kind", ["images", "texts"])
def test_an_add_that_meets_its_collection_recreated_embeds_again_instead_of_503(tmp_path: Path, kind: str) -> None:
    """Another way the generation moves under a write: the collection is dropped and created again
    (same name) while an upload or a text is being embedded. The add embeds again for the collection
    now at that name and answers with it (it used to answer 503 `generation_moved`, the error of a
    search that met a swap twice); nothing is left in the dropped one."""
    from indexer.domain.records import NewText
    from retrieval.fake import FakeEncoder

    class RecreatedOnce(FakeEncoder):
        recreated = False

        def _recreate(self) -> None:
            if not self.recreated:
                self.recreated = True
                catalog.delete_collection("c")
                catalog.create_collection("c", kind, "fake", 16)  # type: ignore[arg-type]

        async def embed_images(self, images: object) -> object:  # type: ignore[override]
            self._recreate()
            return await super().embed_images(images)  # type: ignore[arg-type]

        async def embed_texts(self, texts: object) -> object:  # type: ignore[override]
            self._recreate()
            return await super().embed_texts(texts)  # type: ignore[arg-type]

    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    catalog = open_test_catalog(settings)
    try:
        catalog.create_collection("c", kind, "fake", 16)  # type: ignore[arg-type]
        first_id = catalog.collection("c").id
        encoder = RecreatedOnce(dim=16)
        service = CollectionService(catalog, encoder)

        async def add() -> object:
            await encoder.start()
            if kind == "images":
                return await service.writes.add_upload("c", jpeg(1), read_header(jpeg(1)))
            return (await service.writes.add_text_items("c", [NewText("一只猫")]))[0]

        added: Any = asyncio.run(add())
        state = catalog.collection("c")
        assert state.id != first_id and added.created
        assert catalog.get_collection("c").items == 1
        with catalog.engine.connect() as connection:  # the new row is the collection's now at that name
            owner = connection.exec_driver_sql(f"SELECT collection_id FROM items WHERE id = {int(added.id)}").scalar()
        assert owner == state.id
    finally:
        catalog.close()


def test_a_recorded_directory_that_disappears_mid_load_keeps_the_old_generation_then_loads(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recorded directory vanishes between the check of its files and the load (a volume
    unmounted, a clean-up): the load fails with one line, searches are answered by the previous
    generation meanwhile, never a failure; back at its path, the model is loaded at the next try."""
    import shutil

    from indexer.service import model_loader

    recorded = tmp_path / "toy-vanishing"
    recorded.mkdir()
    write_toy_model(recorded, dim=16, seed=9, name="toy-vanishing", int8=False)
    spare = tmp_path / "spare"
    shutil.copytree(recorded, spare)
    real_create = model_loader.create_encoder
    vanished = threading.Event()

    def vanishing(local: Any, observer: Any = None) -> Any:
        if not vanished.is_set():
            vanished.set()
            shutil.rmtree(recorded)  # after `check_local_model` read every file
        return real_create(local, observer)

    monkeypatch.setattr(model_loader, "create_encoder", vanishing)
    monkeypatch.setattr(model_loader, "RETRY_S", 0.5)

    async def scenario() -> None:
        async with open_runtime(settings) as rt:
            service = rt.service
            assert service is not None and service.migration.model_loader is not None
            service.create("photos", "images")
            for n in range(4):
                await service.writes.add_upload("photos", jpeg(n), read_header(jpeg(n)))
            await _migrate_beside(settings, recorded)
            loader = service.migration.model_loader
            new_model = service.catalog.collection("photos").model
            page = await service.search.text("照片", "photos", PageRequest(k=3))
            assert page.collection.dim == 32 and len(page.results) == 3
            await _until(lambda: vanished.is_set() and loader._attempts.get(new_model) is not None)
            await _until(lambda: (a := loader._attempts.get(new_model)) is not None and a.state == "failed")
            for _ in range(3):  # still answered, by the previous generation
                page = await service.search.text("照片", "photos", PageRequest(k=3))
                assert page.collection.dim == 32 and len(page.results) == 3
            shutil.copytree(spare, recorded)  # back
            await asyncio.sleep(0.6)
            deadline = time.monotonic() + 60
            while not any(e.dim == 16 for e in service.migration.encoders.values()):
                page = await service.search.text("照片", "photos", PageRequest(k=3))  # asks the loader again
                assert len(page.results) == 3
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            page = await service.search.text("照片", "photos", PageRequest(k=3))
            assert page.collection.dim == 16

    asyncio.run(scenario())
