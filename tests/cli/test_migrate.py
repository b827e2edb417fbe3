"""Switching a collection's model without downtime (indexer/storage/sql/generations.py, indexer/service/migration.py): the
shadow fill, items added meanwhile, the atomic swap, rollback, drop-old, resuming an interrupted run,
searches under load during it, another process seeing the swap, on FAISS and Milvus Lite, SQLite and
PostgreSQL; hostile input through `cnclip migrate`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from cli.main import build_cli
from indexer.domain.paging import PageRequest
from indexer.domain.records import NewText
from indexer.errors import MigrationRefused
from indexer.service.collections import CollectionService
from indexer.service.migration import MigrateOptions
from indexer.storage.catalog import SqlCatalog
from retrieval.errors import InvalidInput, NotFound
from retrieval.fake import FakeEncoder
from retrieval.toolchain.toy_model import write_toy_model
from tests.support.engines import EngineUnderTest
from tests.support.indexer_helpers import catalog_settings, cli_env, jpeg, open_test_catalog, write_images
from tests.support.next_model import NewModel

ENGINES = ["faiss", "milvus-lite"]


def _catalog(tmp_path: Path, database_url: str, engine: str) -> SqlCatalog:
    return open_test_catalog(tmp_path / "data", database_url, **EngineUnderTest(engine).overrides())


async def _filled(catalog: SqlCatalog, count: int, first: int = 0) -> tuple[CollectionService, list[int]]:
    old = FakeEncoder()
    await old.start()
    service = CollectionService(catalog, old)
    if first == 0:
        service.create("photos", "images")
    ids = [
        (await service.writes.add_upload("photos", jpeg(first + n), _header(jpeg(first + n)))).id for n in range(count)
    ]
    return service, ids


def _header(data: bytes):  # type: ignore[no-untyped-def]
    from retrieval.preprocess import read_header

    return read_header(data)


@pytest.mark.parametrize("engine", ENGINES)  # named as conftest's pairs it: Milvus Lite with SQLite by default
def test_shadow_fill_swap_rollback_and_drop_old(tmp_path: Path, database_url: str, engine: str) -> None:
    async def scenario() -> None:
        catalog = _catalog(tmp_path, database_url, engine)
        try:
            service, ids = await _filled(catalog, 10)
            new = NewModel()
            report = await service.migration.migrate("photos", new, MigrateOptions(batch=4, swap=False))
            assert (report.embedded, report.swapped) == (10, False)
            status = service.migration.status("photos")
            assert (status.items, status.shadow.vectors, status.coverage) == (10, 10, 1.0)  # type: ignore[union-attr]
            # Searches still use the active (old) model while the shadow is full.
            page = await service.search.image(jpeg(3), "photos", "images", PageRequest(k=1))
            assert page.results[0].item.id == ids[3] and page.results[0].score == pytest.approx(1.0, abs=1e-5)
            # An item added meanwhile (the old model writes) has no shadow vector: the swap refuses.
            extra = await service.writes.add_upload("photos", jpeg(99), _header(jpeg(99)))
            with pytest.raises(MigrationRefused, match="1 items have no fake-next vector"):
                service.migration.swap("photos")
            # The run catches it up, probes, builds the new generation's store and swaps.
            both = CollectionService(catalog, service.encoder, encoders=[new])
            report = await both.migration.migrate("photos", new, MigrateOptions(batch=4))
            assert (report.embedded, report.swapped, report.prepared) == (1, True, True)
            assert report.probe is not None and report.probe.passed and report.probe.found_self == report.probe.sampled
            state = catalog.collection("photos")
            assert (state.model, state.dim, state.generation) == ("fake-next", 16, 1)
            assert catalog.get_collection("photos").model == "fake-next"
            page = await both.search.image(jpeg(99), "photos", "images", PageRequest(k=1))
            assert page.results[0].item.id == extra.id and page.results[0].score == pytest.approx(1.0, abs=1e-5)
            assert catalog.store("photos").state.generation == 1 and catalog.vector_count("photos") == 11
            assert catalog.vector(ids[0]).shape == (16,)
            # Rollback: the previous generation (every item has an old vector) answers again.
            status = both.migration.status("photos")
            assert status.previous is not None and (status.previous.model, status.previous.vectors) == ("fake", 11)
            both.migration.rollback("photos")
            assert (catalog.collection("photos").model, catalog.collection("photos").dim) == ("fake", 32)
            page = await both.search.image(jpeg(5), "photos", "images", PageRequest(k=1))
            assert page.results[0].item.id == ids[5]
            # Forward again (the rolled-back generation is the previous one now), then drop the old one.
            both.migration.rollback("photos")
            assert catalog.collection("photos").model == "fake-next"
            dropped = both.migration.drop_generation("photos", "previous")
            assert dropped.model == "fake"
            assert both.migration.status("photos").previous is None
            with pytest.raises(MigrationRefused, match="no previous generation"):
                both.migration.rollback("photos")
            # A deleted item takes its vectors of every generation with it.
            both.delete_items([ids[0]])
            assert catalog.vector_count("photos") == 10
        finally:
            catalog.close()

    asyncio.run(scenario())


def test_an_interrupted_run_resumes_where_it_stopped(tmp_path: Path, database_url: str) -> None:
    async def scenario() -> None:
        catalog = _catalog(tmp_path, database_url, "faiss")
        try:
            service, _ids = await _filled(catalog, 9)
            with pytest.raises(KeyboardInterrupt):
                await service.migration.migrate("photos", NewModel(fail_after=2), MigrateOptions(batch=2))
            status = service.migration.status("photos")
            assert status.shadow is not None and (status.shadow.vectors, status.missing) == (4, 5)
            assert catalog.collection("photos").model == "fake"  # nothing swapped
            new = NewModel()
            seen: list[tuple[int, int]] = []
            report = await service.migration.migrate(
                "photos", new, MigrateOptions(batch=2), lambda d, t: seen.append((d, t))
            )
            assert report.embedded == 5 and report.swapped  # only what was missing
            assert seen[0] == (6, 9) and seen[-1] == (9, 9)
            assert catalog.collection("photos").model == "fake-next"
        finally:
            catalog.close()

    asyncio.run(scenario())


def test_searches_under_load_never_fail_during_migration_and_swap(tmp_path: Path) -> None:
    async def scenario() -> None:
        catalog = _catalog(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", "faiss")
        try:
            service, ids = await _filled(catalog, 24)
            new = NewModel()
            server = CollectionService(catalog, service.encoder, encoders=[new])  # a server holding both models
            await new.start()
            done = asyncio.Event()
            answers: list[int] = []

            async def searcher(seed: int) -> None:
                while not done.is_set():
                    page = await server.search.image(jpeg(seed % 24), "photos", "images", PageRequest(k=3))
                    assert page.results[0].item.id == ids[seed % 24]  # right answer, whatever the generation
                    answers.append(page.results[0].item.id)
                    seed += 1
                    await asyncio.sleep(0)

            tasks = [asyncio.create_task(searcher(s)) for s in range(4)]
            report = await server.migration.migrate("photos", new, MigrateOptions(batch=3))
            await asyncio.sleep(0.05)
            done.set()
            await asyncio.gather(*tasks)  # any failed search raises here
            assert report.swapped and len(answers) > 20
        finally:
            catalog.close()

    asyncio.run(scenario())


_OTHER_PROCESS = """
import json, sys, numpy as np
from tests.support.indexer_helpers import open_test_catalog
catalog = open_test_catalog(__import__('pathlib').Path(sys.argv[1]), sys.argv[2], sync_interval_s=0.05)
def probe():
    state = catalog.collection("photos")
    query = np.ones(state.dim, dtype=np.float32)
    hits = catalog.search("photos", query, 3, vector_key=state.vector_key)
    store = catalog.store("photos").state
    return {"model": state.model, "store_generation": store.generation, "hits": len(hits)}
print(json.dumps(probe()), flush=True)
sys.stdin.readline()
print(json.dumps(probe()), flush=True)
catalog.close()
"""


def test_another_process_sees_the_swap(tmp_path: Path, database_url: str) -> None:
    async def fill() -> None:
        catalog = _catalog(tmp_path, database_url, "faiss")
        try:
            service, _ = await _filled(catalog, 6)
            await service.migration.migrate("photos", NewModel(), MigrateOptions(swap=False))
        finally:
            catalog.close()

    asyncio.run(fill())
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER_PROCESS, str(tmp_path / "data"), database_url],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert other.stdout is not None and other.stdin is not None
    before = json.loads(other.stdout.readline())
    assert before == {"model": "fake", "store_generation": 0, "hits": 3}
    catalog = _catalog(tmp_path, database_url, "faiss")
    try:
        CollectionService(catalog, None).migration.swap("photos")
    finally:
        catalog.close()
    other.stdin.write("\n")
    other.stdin.flush()
    after = json.loads(other.stdout.readline())
    assert other.wait(30) == 0
    assert after == {"model": "fake-next", "store_generation": 1, "hits": 3}


@pytest.mark.milvus_server
def test_migration_on_the_milvus_server(tmp_path: Path, milvus_server_uri: str) -> None:
    async def scenario() -> None:
        catalog = open_test_catalog(
            tmp_path / "data", f"sqlite:///{tmp_path / 'c.db'}", vector_store="milvus", milvus_uri=milvus_server_uri
        )
        try:
            service, ids = await _filled(catalog, 5)
            new = NewModel()
            both = CollectionService(catalog, service.encoder, encoders=[new])
            report = await both.migration.migrate("photos", new, MigrateOptions())
            assert report.swapped and report.prepared
            page = await both.search.image(jpeg(2), "photos", "images", PageRequest(k=1))
            assert page.results[0].item.id == ids[2]
            both.migration.drop_generation("photos", "previous")
        finally:
            catalog.close()

    asyncio.run(scenario())


# --- the command line, hostile input ----------------------------------------------------------------------
def invoke(args: list[str], env: dict[str, str]) -> Result:
    return CliRunner().invoke(build_cli(), args, env=env)


def test_cnclip_migrate_end_to_end_and_hostile_input(tmp_path: Path, toy_model_dir: Path) -> None:
    env = cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'c.db'}", toy_model_dir)
    write_images(tmp_path / "photos", 5)
    assert invoke(["index", str(tmp_path / "photos"), "--collection", "photos"], env).exit_code == 0
    other = tmp_path / "toy2"
    other.mkdir()
    write_toy_model(other, dim=16, seed=7, name="toy2", int8=False)

    unknown = invoke(["migrate", "-c", "nope", "--status"], env)
    assert unknown.exit_code == 1 and unknown.output.strip() == "error: no collection named 'nope'"
    assert invoke(["migrate", "-c", "photos"], env).exit_code == 2  # no action
    assert invoke(["migrate", "-c", "photos", "--swap", "--rollback"], env).exit_code == 2
    not_a_model = invoke(["migrate", "-c", "photos", "--model", str(tmp_path / "photos")], env)
    assert not_a_model.exit_code == 2 and "no manifest.json" in not_a_model.output  # a usage error
    assert len(not_a_model.output.strip().splitlines()) == 1
    early = invoke(["migrate", "-c", "photos", "--swap"], env)
    assert early.exit_code == 1 and "no migration in progress" in early.output

    filled = invoke(["migrate", "-c", "photos", "--model", str(other), "--no-swap", "--json"], env)
    assert filled.exit_code == 0, filled.output
    body = json.loads(filled.output.strip().splitlines()[-1])
    assert body["swapped"] is False and body["status"]["coverage"] == 1.0 and body["embedded"] == 5
    status = json.loads(invoke(["migrate", "-c", "photos", "--status", "--json"], env).output)
    assert status["shadow"]["dim"] == 16 and status["active"]["dim"] == 32
    swapped = invoke(["migrate", "-c", "photos", "--swap", "--json"], env)
    assert swapped.exit_code == 0 and json.loads(swapped.output)["active"]["model"] == status["shadow"]["model"]
    assert invoke(["migrate", "-c", "photos", "--rollback"], env).exit_code == 0
    assert invoke(["migrate", "-c", "photos", "--drop-old"], env).exit_code == 0
    assert invoke(["migrate", "-c", "photos", "--drop-old"], env).exit_code == 1


def test_a_model_whose_dimension_cannot_serve_the_index_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        catalog = open_test_catalog(tmp_path / "data", f"sqlite:///{tmp_path / 'c.db'}")
        try:
            service = CollectionService(catalog, FakeEncoder())
            service.create("codes", "images", "IVF1,PQ8")
            with pytest.raises(InvalidInput, match="IVF1,PQ8.*12-d"):
                await service.migration.migrate("codes", NewModel(dim=12), MigrateOptions())
            with pytest.raises(InvalidInput, match="embedded with fake already"):
                await service.migration.migrate("codes", FakeEncoder(), MigrateOptions())
            with pytest.raises(NotFound):
                service.migration.status("missing")
            await service.migration.migrate("codes", NewModel(dim=16, model_id="a"), MigrateOptions(swap=False))
            with pytest.raises(MigrationRefused, match="migrating to a already"):
                await service.migration.migrate("codes", NewModel(dim=16, model_id="b"), MigrateOptions())
        finally:
            catalog.close()

    asyncio.run(scenario())


def test_model_dirs_setting_is_validated(tmp_path: Path, toy_model_dir: Path) -> None:
    from pydantic import ValidationError

    assert catalog_settings(tmp_path, "sqlite://", model_dirs=[toy_model_dir]).model_dirs == [toy_model_dir]
    with pytest.raises(ValidationError, match="not a model directory"):
        catalog_settings(tmp_path, "sqlite://", model_dirs=[tmp_path])


def test_items_indexed_during_a_migration_are_caught_up_before_the_swap(tmp_path: Path, toy_model_dir: Path) -> None:
    env = cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'c.db'}", toy_model_dir)
    folder = tmp_path / "photos"
    write_images(folder, 4)
    assert invoke(["index", str(folder), "--collection", "photos"], env).exit_code == 0
    other = tmp_path / "toy2"
    other.mkdir()
    write_toy_model(other, dim=16, seed=7, name="toy2", int8=False)
    assert invoke(["migrate", "-c", "photos", "--model", str(other), "--no-swap"], env).exit_code == 0

    later = tmp_path / "later"
    for n, path in enumerate(write_images(later, 6)[4:]):
        path.rename(folder / f"new-{n}.jpg")
    assert invoke(["index", str(folder), "--collection", "photos"], env).exit_code == 0  # the old model writes
    status = json.loads(invoke(["migrate", "-c", "photos", "--status", "--json"], env).output)
    assert (status["items"], status["missing"]) == (6, 2)
    early = invoke(["migrate", "-c", "photos", "--swap"], env)
    assert early.exit_code == 1 and "2 items have no" in early.output and len(early.output.strip().splitlines()) == 1

    done = invoke(["migrate", "-c", "photos", "--model", str(other), "--json"], env)
    assert done.exit_code == 0, done.output
    report = json.loads(done.output.strip().splitlines()[-1])
    assert report["embedded"] == 2 and report["swapped"] and report["probe"]["passed"]
    assert report["status"]["active"]["dim"] == 16

    (folder / "new-0.jpg").rename(folder / "renamed.jpg")
    write_images(later / "more", 7)[6].rename(folder / "newest.jpg")
    stale = invoke(["index", str(folder), "--collection", "photos"], env)  # still the old model
    assert stale.exit_code == 1 and "CNCLIP_MODEL_DIRS" in stale.output
    fresh = invoke(["index", str(folder), "--collection", "photos"], {**env, "CNCLIP_MODEL_DIR": str(other)})
    assert fresh.exit_code == 0, fresh.output
    status = json.loads(invoke(["migrate", "-c", "photos", "--status", "--json"], env).output)
    assert status["items"] == 7 and status["previous"]["vectors"] == 6  # the newest has no old vector
    rollback = invoke(["migrate", "-c", "photos", "--rollback"], env)
    assert rollback.exit_code == 1 and "1 items have no" in rollback.output


def test_a_text_collection_migrates_and_the_throttle_holds(tmp_path: Path, database_url: str) -> None:
    async def scenario() -> None:
        catalog = _catalog(tmp_path, database_url, "faiss")
        try:
            old = FakeEncoder()
            await old.start()
            service = CollectionService(catalog, old)
            service.create("captions", "texts")
            texts = [NewText(f"第{n}句话") for n in range(8)]
            added = await service.writes.add_text_items("captions", texts)
            new = NewModel(dim=24)
            both = CollectionService(catalog, old, encoders=[new])
            started = time.perf_counter()
            report = await both.migration.migrate("captions", new, MigrateOptions(batch=2, throttle=20.0))
            took = time.perf_counter() - started
            assert report.swapped and report.embedded == 8 and took >= 8 / 20.0 - 0.05  # at most 20 items/s
            assert report.probe is not None and report.probe.text_hits == -1 and report.probe.passed
            page = await both.search.image(jpeg(1), "captions", "texts", PageRequest(k=8))
            assert len(page.results) == 8 and catalog.vector(added[3].id).shape == (24,)
            assert catalog.vector(added[3].id) == pytest.approx(new.embed_texts_sync(["第3句话"])[0], abs=1e-6)
        finally:
            catalog.close()

    asyncio.run(scenario())


def test_two_runs_at_once_share_one_shadow_and_swap_once(tmp_path: Path, database_url: str) -> None:
    async def scenario() -> None:
        catalog = _catalog(tmp_path, database_url, "faiss")
        try:
            service, ids = await _filled(catalog, 10)
            first, second = NewModel(), NewModel()
            reports = await asyncio.gather(
                service.migration.migrate("photos", first, MigrateOptions(batch=1)),
                service.migration.migrate("photos", second, MigrateOptions(batch=1)),
            )
            assert sorted(r.swapped for r in reports) == [False, True]
            assert sum(r.embedded for r in reports) == 10  # no item embedded into the shadow twice
            status = service.migration.status("photos")
            assert (status.active.model, status.active.vectors, status.shadow) == ("fake-next", 10, None)
            assert catalog.vector_count("photos") == 10
        finally:
            catalog.close()

    asyncio.run(scenario())


def test_cnclip_migrate_refuses_a_model_the_index_cannot_take(tmp_path: Path, toy_model_dir: Path) -> None:
    env = cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'c.db'}", toy_model_dir)
    write_images(tmp_path / "photos", 3)
    indexed = invoke(["index", str(tmp_path / "photos"), "--collection", "codes", "--index", "IVF1,PQ8"], env)
    assert indexed.exit_code == 0, indexed.output
    odd = tmp_path / "toy12"
    odd.mkdir()
    write_toy_model(odd, dim=12, seed=2, name="toy12", int8=False)
    refused = invoke(["migrate", "-c", "codes", "--model", str(odd)], env)
    assert refused.exit_code == 1 and len(refused.output.strip().splitlines()) == 1
    assert "uses index 'IVF1,PQ8', which 12-d vectors of toy12" in refused.output
    same = invoke(["migrate", "-c", "codes", "--model", str(toy_model_dir)], env)
    assert same.exit_code == 1 and "is embedded with" in same.output
    assert json.loads(invoke(["migrate", "-c", "codes", "--status", "--json"], env).output)["shadow"] is None
