"""Serving during and after a model migration: the collections API shows a migration in progress and
names the active model, a server answers a collection with its active model's encoder (the settings'
model or one of CNCLIP_MODEL_DIRS), and one without that model says which to add."""

from __future__ import annotations

import asyncio
from pathlib import Path

from api.config import Settings
from indexer.bulk.pipeline import ImageIndexer
from indexer.domain.paging import PageRequest
from indexer.runtime import open_runtime
from indexer.service.collections import CollectionService
from indexer.service.migration import MigrateOptions
from retrieval.preprocess import read_header
from retrieval.toolchain.toy_model import write_toy_model
from tests.support.api_helpers import api_client, open_test_catalog, seed
from tests.support.indexer_helpers import jpeg
from tests.support.next_model import NewModel


def test_the_collections_api_shows_a_migration_and_the_active_model(settings: Settings) -> None:
    catalog = open_test_catalog(settings)
    try:
        with api_client(settings, catalog=catalog) as client:
            seed(client)
            new = NewModel()
            migrator = CollectionService(catalog, None)
            asyncio.run(migrator.migration.migrate("photos", new, MigrateOptions(swap=False)))
            listed = {c["name"]: c for c in client.get("/v1/collections").json()}
            items = listed["photos"]["items"]
            assert listed["photos"]["model"] == "fake"
            assert listed["photos"]["migration"] == {"to_model": "fake-next", "covered": items, "coverage": 1.0}
            assert listed["captions"]["migration"] is None
            search = client.post("/v1/search/text", json={"query": "一只猫", "collection": "photos"})
            assert search.status_code == 200 and search.json()["results"]  # the active model answers meanwhile
            migrator.migration.swap("photos")
            one = client.get("/v1/collections/photos").json()
            assert (one["model"], one["dim"], one["migration"]) == ("fake-next", 16, None)
            refused = client.post("/v1/search/text", json={"query": "一只猫", "collection": "photos"})
            assert refused.status_code == 422 and "CNCLIP_MODEL_DIRS" in refused.json()["error"]["message"]
    finally:
        catalog.close()


def test_a_server_holding_two_models_answers_each_collection_with_its_own(tmp_path: Path, toy_model_dir: Path) -> None:
    other = tmp_path / "toy2"
    other.mkdir()
    write_toy_model(other, dim=16, seed=3, name="toy2", int8=False)
    settings = Settings(
        _env_file=None, model_dir=toy_model_dir, model_dirs=[other], data_dir=tmp_path / "data", provider="cpu"
    )

    async def scenario() -> None:
        async with open_runtime(settings) as rt:
            assert rt.service is not None and len(rt.encoders) == 2
            first, second = rt.encoders.values()
            assert (first.dim, second.dim) == (32, 16)
            rt.service.create("photos", "images")
            for n in range(4):
                await rt.service.writes.add_upload("photos", jpeg(n), read_header(jpeg(n)))
            report = await rt.service.migration.migrate("photos", second, MigrateOptions())
            assert report.swapped and rt.service.catalog.collection("photos").dim == 16
            page = await rt.service.search.image(jpeg(2), "photos", "images", PageRequest(k=1))
            assert page.results[0].score > 0.99  # the toy2 encoder embedded the query
            added = await rt.service.writes.add_upload("photos", jpeg(9), read_header(jpeg(9)))
            assert rt.service.catalog.vector(added.id).shape == (16,)

    asyncio.run(scenario())


def test_indexing_after_a_swap_embeds_with_the_collections_new_model(tmp_path: Path, toy_model_dir: Path) -> None:
    """The pipeline (`cnclip index`, a server's folder watcher) embeds with the encoder of the
    collection's active model, not the process's default one: after a swap to a model the server
    holds through CNCLIP_MODEL_DIRS, a watched folder's new photos still go in, as 16-d vectors."""
    other = tmp_path / "toy2"
    other.mkdir()
    write_toy_model(other, dim=16, seed=3, name="toy2", int8=False)
    settings = Settings(
        _env_file=None, model_dir=toy_model_dir, model_dirs=[other], data_dir=tmp_path / "data", provider="cpu"
    )
    folder = tmp_path / "photos"
    folder.mkdir()

    async def scenario() -> None:
        async with open_runtime(settings) as rt:
            assert rt.service is not None
            (folder / "a.jpg").write_bytes(jpeg(1))
            first = await ImageIndexer(rt.service, "photos").run(folder)
            assert first.added == 1 and rt.service.catalog.collection("photos").dim == 32
            _default, second = rt.encoders.values()
            assert (await rt.service.migration.migrate("photos", second, MigrateOptions())).swapped
            (folder / "b.jpg").write_bytes(jpeg(2))
            after = await ImageIndexer(rt.service, "photos").run(folder)
            assert after.added == 1 and not after.failures
            added = rt.service.file_states("photos")[str(folder / "b.jpg")]
            assert rt.service.catalog.vector(added.id).shape == (16,)

    asyncio.run(scenario())
