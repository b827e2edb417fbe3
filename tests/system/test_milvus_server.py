"""What differs between Milvus versions, decided once at connect (indexer/storage/vectors/milvus/plan.py
`MilvusCapabilities`), checked as pure rules and on the real Milvus 2.3.5 server: the minimum
version is enforced with a clear error; filters are inlined as escaped literals where templates are
absent; a request the server cannot parse is a permanent error (501 `vector_store_incompatible`),
never the retryable 503; and reads see writes at once even in a collection whose default
consistency is Bounded (the pymilvus default for a collection made by any other tool).

The contract every engine keeps (search, filters, delete, reconcile, ...) is tests/indexer/storage/test_vector_stores.py.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pymilvus import DataType, MilvusClient

from api.config import Settings
from indexer.domain.records import SearchFilters
from indexer.storage.vectors.base import ItemAttrs, SearchTuning, StoreSpec, VectorStoreIncompatible
from indexer.storage.vectors.milvus import plan as milvus_plan
from indexer.storage.vectors.milvus.plan import LITE, filter_arguments, is_permanent, server_capabilities
from indexer.storage.vectors.milvus.store import FIELDS, MilvusEngine, collection_name
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import api_client
from tests.support.indexer_helpers import jpeg

DIM = 8


@pytest.mark.parametrize(
    ("version", "templates"),
    [("v2.3.5-lite", False), ("v2.3.0", False), ("2.4.13-hotfix", False), ("v2.5.4", True), ("3.0.0", True)],
)
def test_a_server_of_2_3_or_newer_is_accepted_and_templates_start_at_2_5(version: str, templates: bool) -> None:
    supports = server_capabilities(version)
    assert not supports.lite and supports.filter_templates is templates and supports.nullable_fields is templates
    assert "IVF_PQ" in supports.index_types and version in supports.label


@pytest.mark.parametrize("version", ["v2.2.16", "2.1", "1.1.0", "", "Milvus"])
def test_an_older_or_unreadable_version_is_refused_naming_the_minimum(version: str) -> None:
    with pytest.raises(VectorStoreIncompatible, match=r"cnclip needs Milvus 2\.3\.0 or newer") as err:
        server_capabilities(version)
    assert err.value.code == "vector_store_incompatible"


def test_filters_are_escaped_literals_unless_the_server_takes_templates() -> None:
    filters = SearchFilters(tags=['a" or id > 0 or tags == "'], mime=["image/png", ""])
    old = filter_arguments(filters, server_capabilities("v2.3.5"))
    assert old == {"filter": 'array_contains_all(tags, ["a\\" or id > 0 or tags == \\""]) and mime in ["image/png"]'}
    assert filter_arguments(filters, LITE) == old  # Lite ignores template values: the same literals
    new = filter_arguments(filters, server_capabilities("v2.5.4"))
    assert new["filter"] == "array_contains_all(tags, {tags}) and mime in {mime}"
    assert new["filter_params"] == {"tags": ['a" or id > 0 or tags == "'], "mime": ["image/png"]}
    assert filter_arguments(SearchFilters(mime=[""]), LITE) == {"filter": milvus_plan.NOTHING}  # "" is "no mime"
    assert filter_arguments(None, LITE) == {} == filter_arguments(SearchFilters(), LITE)


def test_parse_errors_and_bad_parameters_are_permanent_outages_are_not() -> None:
    assert is_permanent(65535, "failed to create query plan: cannot parse expression: mime in {mime}")
    assert is_permanent(1100, "varchar field 'mime' is illegal, array type mismatch")
    assert is_permanent(1, "method Unimplemented: AllocTimestamp")
    assert not is_permanent(2, "service unavailable: connection refused")
    assert not is_permanent(101, "collection not loaded")
    assert not is_permanent(8, "rate limit exceeded")


# --- on the real server ------------------------------------------------------------------------------
def server_engine(uri: str) -> MilvusEngine:
    return MilvusEngine(uri, "", SearchTuning())


def spec(key: str) -> StoreSpec:
    return StoreSpec(1, "c", DIM, "Flat", "fake", key)


def no_vectors(ids: np.ndarray) -> np.ndarray:
    return np.zeros((len(ids), DIM), np.float32)


@pytest.mark.milvus_server
def test_the_real_server_is_asked_once_what_it_supports(milvus_server_uri: str, milvus_server: Any) -> None:
    engine = server_engine(milvus_server_uri)
    try:
        supports = engine.capabilities()
        assert supports is engine.capabilities()  # one record per connection
        assert milvus_server.version in supports.label and not supports.filter_templates
        assert not supports.nullable_fields and not supports.lite
    finally:
        engine.close()


@pytest.mark.milvus_server
def test_an_older_server_stops_serve_with_one_line_naming_the_minimum(
    milvus_server_uri: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from pymilvus import MilvusClient
    from typer.testing import CliRunner

    from cli.main import build_cli

    monkeypatch.setattr(MilvusClient, "get_server_version", lambda self, **kw: "v2.2.16")
    with pytest.raises(VectorStoreIncompatible, match=r"version v2\.2\.16; cnclip needs Milvus 2\.3\.0 or newer"):
        server_engine(milvus_server_uri).client()
    env = {"CNCLIP_DATA_DIR": str(tmp_path), "CNCLIP_VECTOR_STORE": "milvus", "CNCLIP_MILVUS_URI": milvus_server_uri}
    stopped = CliRunner().invoke(build_cli(), ["serve", "--port", "0"], env=env)
    assert stopped.exit_code == 1  # before the port is bound and the model loads
    lines = stopped.output.strip().splitlines()
    assert len(lines) == 1 and "2.3.0 or newer" in lines[0] and milvus_server_uri in lines[0], lines


@pytest.mark.milvus_server
def test_a_filter_the_server_cannot_parse_is_501_never_a_retryable_503(
    milvus_server_uri: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the engine did before it asked the server: `{placeholder}` templates sent to 2.3."""
    settings = settings.model_copy(update={"vector_store": "milvus", "milvus_uri": milvus_server_uri})
    with api_client(settings, encoder=FakeEncoder(dim=16)) as client:
        assert client.post("/v1/collections", json={"name": "p", "kind": "images"}).status_code == 201
        photo = {"file": ("a.jpg", jpeg(1), "image/jpeg")}
        added = client.post("/v1/collections/p/items", files=photo, data={"tags": "a"})
        assert added.status_code == 201, added.text
        filtered = {"query": "猫", "collection": "p", "filters": {"tags": ["a"], "mime": ["image/jpeg"]}}
        good = client.post("/v1/search/text", json=filtered)
        assert good.status_code == 200 and len(good.json()["results"]) == 1, good.text
        pretend = server_capabilities("v2.5.0")  # claims templates: the server cannot parse them
        monkeypatch.setattr(MilvusEngine, "capabilities", lambda self: pretend)
        r = client.post("/v1/search/text", json=filtered)
        assert r.status_code == 501, r.text
        assert r.json()["error"]["code"] == "vector_store_incompatible"
        assert "retrying will not help" in r.json()["error"]["message"]


def bounded(create: Any) -> Any:
    """`MilvusClient.create_collection` as pymilvus's defaults have it (Bounded), whatever is asked."""
    return lambda self, *args, **kwargs: create(self, *args, **{**kwargs, "consistency_level": "Bounded"})


@pytest.mark.milvus_server
def test_reads_see_writes_at_once_in_a_bounded_collection(
    milvus_server_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = server_engine(milvus_server_uri)
    with monkeypatch.context() as made_elsewhere:  # created the way pymilvus does by default: Bounded
        made_elsewhere.setattr(MilvusClient, "create_collection", bounded(MilvusClient.create_collection))
        store = engine.open(spec("bounded1"), no_vectors, lambda _: np.empty(0, np.int64))
    try:
        described = engine.client().describe_collection(collection_name(spec("bounded1")))
        assert described["consistency_level_name"] == "Bounded"
        rng = np.random.default_rng(0)
        for i in range(1, 13):
            vector = rng.standard_normal(DIM).astype(np.float32)
            vector /= np.linalg.norm(vector)
            store.upsert(np.array([i]), vector[None], [ItemAttrs("image/png", ("t",), datetime(2024, 1, 1))])
            assert i in store.search(vector, 20)[0], f"write {i} not seen by the next search"
            assert store.count() == i
        store.remove(np.array([1]))
        assert 1 not in store.search(vector, 20)[0] and store.count() == 11
        assert sorted(store.ids()) == list(range(2, 13))
    finally:
        engine.drop(spec("bounded1"))
        engine.close()


@pytest.mark.milvus_server
def test_listing_ids_on_a_2_3_server_prints_no_mvcc_warning(
    milvus_server_uri: str, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """pymilvus warns `failed to get mvccTs` for every query iterator on a server before 2.4 (the
    fallback snapshot is harmless, see milvus_store._ClientSideSnapshot): the user never sees it."""
    engine = server_engine(milvus_server_uri)
    try:
        store = engine.open(spec("quiet1"), no_vectors, lambda _: np.empty(0, np.int64))
        store.upsert(
            np.array([1, 2]), np.eye(2, DIM, dtype=np.float32), [ItemAttrs(None, (), datetime(2024, 1, 1))] * 2
        )
        capfd.readouterr()
        with caplog.at_level(logging.DEBUG):
            assert sorted(store.ids()) == [1, 2]  # the iterator's snapshot still holds the writes just made
        assert "mvccTs" not in capfd.readouterr().err and "mvccTs" not in caplog.text
    finally:
        engine.drop(spec("quiet1"))
        engine.close()


@pytest.mark.parametrize("where", ["lite", "server"])
def test_a_collection_left_without_an_index_by_a_killed_create_is_made_again(
    where: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Creating a collection is three calls (collection, index, load); SIGKILL between the first two (seen
    in tests/system/test_crash_safety_milvus.py) left a collection that every later open failed to load
    ("index not found"), an outage no retry cured."""
    uri = str(tmp_path / "lite.db") if where == "lite" else request.getfixturevalue("milvus_server_uri")
    engine = MilvusEngine(uri, "", SearchTuning())
    try:
        client = engine.client()
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=DIM)
        properties = {"cnclip.model": "fake", "cnclip.dim": str(DIM), "cnclip.index": "Flat", "cnclip.fields": FIELDS}
        client.create_collection(collection_name(spec("k")), schema=schema, properties=properties)  # the first call
        assert not client.list_indexes(collection_name(spec("k")))
        store = engine.open(spec("k"), no_vectors, lambda _: np.empty(0))
        assert store.problem == "it had no index: a create that did not finish"
        unit = np.eye(DIM, dtype=np.float32)[:3]
        store.upsert(np.array([1, 2, 3]), unit, [ItemAttrs("image/jpeg", (), datetime(2026, 1, 1))] * 3)
        assert store.search(unit[1], 1)[0][0] == 2
        assert engine.open(spec("k"), no_vectors, lambda _: np.empty(0)).problem is None  # now whole
    finally:
        engine.close()
