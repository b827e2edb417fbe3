"""The collection service owns the rules: model (reads and writes), names (one rule, case-insensitive),
kind, the cap, index validation; deletions are remembered; two catalogs on one database (two
processes) see each other's commits."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import numpy as np
import pytest

from api.schemas import CollectionName
from indexer.bulk.pipeline import ImageIndexer
from indexer.domain.names import COLLECTION_NAME_PATTERN, check_collection_name
from indexer.domain.paging import PageRequest
from indexer.domain.records import NewImage, NewText
from retrieval.errors import Conflict, InvalidInput, NotFound
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import api_client, image_bytes
from tests.support.indexer_helpers import jpeg, open_test_catalog, random_unit, service_for, write_images

DIM = 32


def images(count: int, start: int = 0) -> list[NewImage]:
    return [NewImage(data=jpeg(start + i)) for i in range(count)]


def test_a_write_with_another_model_is_refused_like_a_search(catalog) -> None:
    old = service_for(catalog, FakeEncoder(dim=DIM, model_id="old@0123456789ab"))
    new = service_for(catalog, FakeEncoder(dim=DIM, model_id="new@ba9876543210"))
    old.create("photos", "images")
    old.writes.add_images("photos", images(2), random_unit(2, DIM))
    with pytest.raises(InvalidInput, match="Re-index it with this model") as write:
        new.writes.add_images("photos", images(1, start=5), random_unit(1, DIM))
    with pytest.raises(InvalidInput, match="Re-index it with this model") as read:
        new.search.vector("photos", "images", random_unit(1, DIM)[0], PageRequest(k=5))
    assert str(write.value) == str(read.value)  # one rule, one message
    assert catalog.get_collection("photos").items == 2  # nothing was written


def test_the_api_refuses_a_write_with_another_model_with_422(settings) -> None:
    with api_client(settings, encoder=FakeEncoder(dim=DIM, model_id="old@0123456789ab")) as client:
        assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
    with api_client(settings, encoder=FakeEncoder(dim=DIM, model_id="new@ba9876543210")) as client:
        response = client.post("/v1/collections/photos/items", files={"file": ("a.png", image_bytes((1, 2, 3)))})
        assert response.status_code == 422 and "Re-index it with this model" in response.json()["error"]["message"]
        search = client.post("/v1/search/text", json={"query": "猫", "collection": "photos"})
        assert search.status_code == 422 and search.json()["error"]["message"] == response.json()["error"]["message"]
        texts = client.post("/v1/collections", json={"name": "captions", "kind": "texts"})
        assert texts.status_code == 201
        wrong_kind = client.post("/v1/collections/captions/items", files={"file": ("a.png", image_bytes((1, 2, 3)))})
        assert wrong_kind.status_code == 422
        assert wrong_kind.json()["error"]["message"] == (
            "collection 'captions' holds texts; adding images needs an image collection"
        )


def test_names_are_one_rule_and_case_insensitive(catalog) -> None:
    service = service_for(catalog, FakeEncoder(dim=DIM))
    assert service.create("照片", "images").name == "照片"  # the API's pattern and the catalog agree
    service.create("demo", "images")
    with pytest.raises(Conflict, match="case-insensitive"):
        service.create("DEMO", "texts")
    assert service.get("Demo").name == "demo"
    service.writes.add_images("DEMO", images(1), random_unit(1, DIM))  # any case names the same collection
    assert service.get("demo").items == 1
    for bad in ["", "_x", "a b", "a/b", "x" * 65, "ｄｅｍｏ", "demo\n", "..", "-a"]:
        with pytest.raises(InvalidInput):
            service.create(bad, "images")
    # The API schema's pattern is the names module's, so the edge and the catalog cannot drift.
    assert CollectionName.__metadata__[0].pattern == COLLECTION_NAME_PATTERN  # type: ignore[attr-defined]
    assert re.fullmatch(COLLECTION_NAME_PATTERN, "照片") and check_collection_name("照片") == "照片"


def test_collection_cap_and_index_validation(catalog) -> None:
    service = service_for(catalog, FakeEncoder(dim=DIM), max_collections=2)
    for bad in ["IVF0", "IVF0,Flat", "HNSW0", "garbage", "IVF99999999,Flat", "PQ7"]:
        with pytest.raises(InvalidInput):
            service.create("c", "images", bad)
    service.create("a", "images", "HNSW16")
    service.create("b", "texts", "IVF64,Flat")
    with pytest.raises(Conflict, match="CNCLIP_MAX_COLLECTIONS"):
        service.create("c", "images")
    assert service.delete_collection("a") == 0
    service.create("c", "images")


def test_deleted_items_are_not_brought_back_by_indexing(tmp_path: Path, catalog) -> None:
    encoder = FakeEncoder(dim=DIM)
    service = service_for(catalog, encoder)
    folder = tmp_path / "photos"
    write_images(folder, 6)

    def index(**options: object):
        return asyncio.run(ImageIndexer(service, "photos", batch_size=4, **options).run(folder))  # type: ignore[arg-type]

    assert index().added == 6
    states = catalog.file_states("photos")
    victims = [states[str(folder / "0001.jpg")].id, states[str(folder / "0004.jpg")].id]
    assert service.delete_items(victims) == 2
    again = index()
    assert again.added == 0 and again.deleted_before == 2
    assert catalog.get_collection("photos").items == 4 and catalog.remembered_count("photos") == 2
    # A copy of a deleted photo under another name stays deleted too: the bytes are what is remembered.
    (folder / "copy.jpg").write_bytes((folder / "0001.jpg").read_bytes())
    assert index().deleted_before == 3  # the two deleted files and the copy
    restored = index(restore_deleted=True)
    assert restored.added == 2 and catalog.get_collection("photos").items == 6  # copy.jpg is a duplicate
    assert catalog.remembered_count("photos") == 0


def test_pruned_and_replaced_rows_are_not_remembered(tmp_path: Path, catalog) -> None:
    encoder = FakeEncoder(dim=DIM)
    service = service_for(catalog, encoder)
    folder = tmp_path / "photos"
    files = write_images(folder, 3)
    asyncio.run(ImageIndexer(service, "photos").run(folder))
    files[0].unlink()
    files[1].write_bytes(jpeg(99))  # new bytes at a known path
    summary = asyncio.run(ImageIndexer(service, "photos").run(folder, prune=True))
    assert summary.pruned == 1 and summary.changed == 1
    assert catalog.remembered_count("photos") == 0
    files[0].write_bytes(jpeg(0))  # the pruned file is back: it is indexed again
    assert asyncio.run(ImageIndexer(service, "photos").run(folder)).added == 1


def test_a_second_catalog_on_the_same_database_sees_adds_and_deletes(tmp_path: Path, database_url: str) -> None:
    """Two processes in miniature: each catalog has its own vector store, SQL is shared."""
    server = open_test_catalog(tmp_path / "server", database_url, sync_interval_s=0.2)
    writer = open_test_catalog(tmp_path / "writer", database_url)
    try:
        service = service_for(server, FakeEncoder(dim=DIM))
        service.create("photos", "images")
        vectors = random_unit(5, DIM, seed=3)
        ids = [r.id for r in writer.add_images("photos", images(5), vectors)]
        deadline = time.monotonic() + 2.0
        while len(server.search("photos", vectors[0], k=10)) < 5:
            assert time.monotonic() < deadline, "adds of another process not searchable within 2 s"
            time.sleep(0.05)
        assert server.search("photos", vectors[2], k=1)[0].id == ids[2]
        writer.delete(ids[:2], reason="user", remember=True)
        deadline = time.monotonic() + 2.0
        while {h.id for h in server.search("photos", vectors[0], k=10)} & set(ids[:2]):
            assert time.monotonic() < deadline, "deletes of another process still found after 2 s"
            time.sleep(0.05)
        assert sorted(server.index_ids("photos")) == sorted(ids[2:]) == list(server.sql_ids("photos"))
        # A collection deleted and made again under the same name by the other process is a new one.
        writer.delete_collection("photos")
        writer.create_collection("PHOTOS", "texts", "fake", DIM)
        writer.add_texts("PHOTOS", [NewText("猫")], random_unit(1, DIM))
        time.sleep(0.25)
        assert len(server.search("photos", random_unit(1, DIM)[0], k=10)) == 1
    finally:
        server.close()
        writer.close()


def test_the_version_check_of_an_unchanged_collection_is_cheap(tmp_path: Path, database_url: str) -> None:
    """Every search may check the collection's version (sync interval 0 forces it): one indexed
    query, well under a millisecond on either database (measured in BENCHMARKS.md; 5 ms here is
    only a guard against a scan sneaking in)."""
    catalog = open_test_catalog(tmp_path / "data", database_url, sync_interval_s=0)
    try:
        service = service_for(catalog, FakeEncoder(dim=DIM))
        service.create("photos", "images")
        catalog.add_images("photos", images(50), random_unit(50, DIM))
        catalog.store("photos")
        times = []
        for _ in range(200):
            started = time.perf_counter()
            catalog.store("photos")
            times.append(time.perf_counter() - started)
        assert float(np.median(times)) < 0.005
    finally:
        catalog.close()


def test_unknown_collection_is_404_and_deleting_one_needs_its_name(catalog) -> None:
    service = service_for(catalog, FakeEncoder(dim=DIM))
    with pytest.raises(NotFound):
        service.search.vector("nothing", "images", random_unit(1, DIM)[0], PageRequest(k=3))
    with pytest.raises(NotFound):
        service.delete_collection("nothing")


def test_defaults_kind_and_model_are_the_services_rules_with_one_error(catalog) -> None:
    """The rules the catalog once repeated (its own `ensure_collection`, `default_collection` and
    kind/model checks, where a model mismatch was a 409) live in the service only: one rule, one
    error (422), whichever entry point meets it."""
    service = service_for(catalog, FakeEncoder(dim=DIM, model_id="fake"))
    first = service.create("photos", "images")
    service.create("captions", "texts")
    service.create("more", "images")
    assert service.resolver.resolve(None, "images").name == "photos"  # the oldest
    assert service.resolver.resolve(None, "texts").name == "captions"
    assert service.ensure("photos", "images").id == first.id
    other = service_for(catalog, FakeEncoder(dim=DIM, model_id="other-model"))
    with pytest.raises(InvalidInput, match="Re-index it with this model") as ensured:
        other.ensure("photos", "images")
    with pytest.raises(InvalidInput, match="Re-index it with this model") as added:
        other.writes.add_images("photos", images(1), random_unit(1, DIM))
    assert str(ensured.value) == str(added.value)
    with pytest.raises(InvalidInput, match="collection 'captions' holds texts; adding images needs an image"):
        service.writes.add_images("captions", images(1), random_unit(1, DIM))
    assert not hasattr(catalog, "ensure_collection") and not hasattr(catalog, "default_collection")
    assert catalog.get_collection("photos").items == catalog.get_collection("captions").items == 0


def test_resolve_reads_sql_and_opens_no_vector_store(catalog) -> None:
    """Which collection a request means is SQL's answer: resolving (and writing) opens no store, so a
    bulk indexer needs the engine only for its final flush; a search opens it."""
    service = service_for(catalog, FakeEncoder(dim=DIM))
    service.create("photos", "images")
    opened: list[str] = []
    real_open = catalog.vectors.open
    catalog.vectors.open = lambda spec, *rest: opened.append(spec.name) or real_open(spec, *rest)  # type: ignore[method-assign]
    service.resolver.resolve("photos", "images")
    service.resolver.resolve(None, "images")
    service.writes.add_images("photos", images(3), random_unit(3, DIM))
    assert opened == [] and catalog.stores.held(catalog.collection("photos").id) is None
    found = service.search.vector("photos", "images", random_unit(1, DIM)[0], PageRequest(k=5))
    assert opened == ["photos"] and len(found.results) == 3
