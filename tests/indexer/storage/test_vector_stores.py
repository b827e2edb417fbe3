"""One contract, every vector engine: FAISS files, Milvus Lite and the real Milvus server (the `engine`
fixture, tests/conftest.py), through `SqlCatalog`, on SQLite and PostgreSQL. Add/search (cosine scores, SQL ids), pushed-down filters that still fill k, delete,
reconcile on open (one log line), rebuild from SQL, idempotent upserts, collection deletion, and a
Milvus Lite file held by another process.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from indexer.domain.records import NewImage, NewText, SearchFilters
from indexer.storage.catalog import SqlCatalog
from indexer.storage.vectors.base import StoreSpec, VectorStoreBusy
from tests.support.engines import EngineUnderTest
from tests.support.indexer_helpers import create_once, jpeg, open_test_catalog, png, random_unit

DIM = 16
LITE = EngineUnderTest("milvus-lite")
HOSTILE = '标签\\" or true or "\n\\'  # ends in a backslash: an unescaped one would eat the closing quote


def open_store(tmp_path: Path, database_url: str, engine: EngineUnderTest, **overrides: object) -> SqlCatalog:
    return open_test_catalog(tmp_path / "data", database_url, **engine.overrides(), **overrides)


def fill_texts(catalog: SqlCatalog, count: int, factory: str = "Flat", seed: int = 0) -> tuple[list[int], np.ndarray]:
    create_once(catalog, "c", "texts", "fake", DIM, factory)
    vectors = random_unit(count, DIM, seed)
    texts = [NewText(f"text {seed} {i}", tags=["even"] if i % 2 == 0 else []) for i in range(count)]
    return [r.id for r in catalog.add_texts("c", texts, vectors)], vectors


def exact_top(ids: list[int], vectors: np.ndarray, query: np.ndarray, k: int) -> tuple[list[int], np.ndarray]:
    scores = vectors @ query
    order = np.argsort(-scores, kind="stable")[:k]
    return [ids[i] for i in order], scores[order]


def engine_holds(catalog: SqlCatalog, spec: StoreSpec) -> bool:
    """Whether the engine still keeps data for the collection (a FAISS file, a Milvus collection)."""
    vectors = catalog.vectors
    if vectors.name == "faiss":
        return vectors.path(spec).exists()  # type: ignore[attr-defined]
    from indexer.storage.vectors.milvus.store import collection_name

    return bool(vectors.client().has_collection(collection_name(spec)))  # type: ignore[attr-defined]


def settle(catalog: SqlCatalog, name: str) -> None:
    """Save, and on Milvus wait until its background build has indexed every row, so that the
    search goes through the index under test rather than a scan of the write buffer (a server seals
    its segments only when told to, or when they are full)."""
    catalog.flush()
    if catalog.vectors.name != "milvus":
        return
    from indexer.storage.vectors.milvus.store import collection_name

    state = catalog.collection(name)
    spec = StoreSpec(state.id, state.name, state.dim, state.index, state.model, state.vector_key)
    client = catalog.vectors.client()  # type: ignore[attr-defined]
    if not catalog.vectors.lite:  # type: ignore[attr-defined]
        client.flush(collection_name(spec))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        index = client.describe_index(collection_name(spec), "vector")
        if index["indexed_rows"] == catalog.get_collection(name).items and not index["pending_index_rows"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"Milvus did not index {name} within 30 s: {index}")


def sync_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "indexer.storage.sync"]


def test_search_gives_sql_ids_and_cosine_scores(tmp_path, database_url, engine) -> None:
    catalog = open_store(tmp_path, database_url, engine)
    ids, vectors = fill_texts(catalog, 60)
    for row in (0, 17, 59):
        hits = catalog.search("c", vectors[row], k=10)
        expected_ids, expected_scores = exact_top(ids, vectors, vectors[row], 10)
        assert [h.id for h in hits] == expected_ids and hits[0].id == ids[row]
        assert [h.score for h in hits] == pytest.approx(list(expected_scores), abs=1e-5)
    assert catalog.get_collection("c").vectors == 60
    assert list(catalog.index_ids("c")) == ids == list(catalog.sql_ids("c"))
    catalog.close()


@pytest.mark.parametrize("factory", ["Flat", "HNSW8"])
def test_filters_run_in_the_engine_and_fill_k(tmp_path, database_url, engine, factory) -> None:
    catalog = open_store(tmp_path, database_url, engine, index_train_min=20)
    catalog.create_collection("p", "images", "fake", DIM, factory)
    vectors = random_unit(80, DIM, seed=3)
    day0 = datetime(2020, 1, 1, tzinfo=UTC)

    def taken(i: int) -> dict[str, Any]:  # every third photo has no known date
        return {} if i % 3 == 0 else {"taken_at": day0 + timedelta(days=i), "taken_source": "exif"}

    first = [NewImage(jpeg(i), tags=["even"] if i % 2 == 0 else [], mime=None, **taken(i)) for i in range(40)]
    first[5] = NewImage(jpeg(5), tags=["rare", 'x" or tags != "{x}'], **taken(5))  # a hostile tag matches itself only
    first[6] = NewImage(jpeg(6), tags=["rare", "even"], **taken(6))
    first[7] = NewImage(jpeg(7), tags=[HOSTILE], **taken(7))  # escapes: backslash, quote, newline, not ASCII
    ids = [r.id for r in catalog.add_images("p", first, vectors[:40])]
    time.sleep(0.01)  # created_at of the second batch is strictly later
    second = [NewImage(png(i), tags=["even"] if i % 2 == 0 else [], **taken(i)) for i in range(40, 80)]
    ids += [r.id for r in catalog.add_images("p", second, vectors[40:])]
    settle(catalog, "p")
    records = {r.id: r for r in catalog.get_many(ids)}
    split = records[ids[40]].created_at
    assert split is not None and records[ids[39]].created_at < split

    def passing(filters: SearchFilters) -> list[int]:
        keep = []
        for item_id in ids:
            record = records[item_id]
            created = record.created_at
            assert created is not None
            if filters.tags and not set(filters.tags) <= set(record.tags):
                continue
            if filters.mime and record.mime not in filters.mime:
                continue
            if filters.date_from and created < filters.date_from:
                continue
            if filters.date_to and created > filters.date_to:
                continue
            if filters.taken_from and (record.taken_at is None or record.taken_at < filters.taken_from):
                continue
            if filters.taken_to and (record.taken_at is None or record.taken_at > filters.taken_to):
                continue
            keep.append(item_id)
        return keep

    query = random_unit(1, DIM, seed=11)[0]
    cases = [
        SearchFilters(tags=["even"]),
        SearchFilters(tags=["rare"]),  # 2 items pass: k=10 gives both, never an empty page
        SearchFilters(tags=['x" or tags != "{x}']),
        SearchFilters(tags=["x"]),  # a prefix of the hostile tag: nothing
        SearchFilters(tags=[HOSTILE]),
        SearchFilters(tags=[HOSTILE[:-1]]),  # without its last character: nothing
        SearchFilters(mime=["image/png"]),
        SearchFilters(mime=["image/jpeg"], tags=["even"]),
        SearchFilters(date_from=split),
        SearchFilters(date_to=split - timedelta(microseconds=1)),
        SearchFilters(date_from=split, date_to=split),
        SearchFilters(taken_from=day0 + timedelta(days=50)),
        SearchFilters(taken_to=day0 + timedelta(days=10)),  # photos with no date never pass
        SearchFilters(taken_from=day0 + timedelta(days=7), taken_to=day0 + timedelta(days=7), tags=["rare"]),
    ]
    for filters in cases:
        allowed = passing(filters)
        rows = [ids.index(i) for i in allowed]
        expected, scores = exact_top(allowed, vectors[rows], query, 10) if rows else ([], np.empty(0))
        hits = catalog.search("p", query, k=10, filters=filters)
        assert len(hits) == min(10, len(allowed)), filters
        assert [h.id for h in hits] == expected, filters
        assert [h.score for h in hits] == pytest.approx(list(scores), abs=1e-5)
    assert len(passing(SearchFilters(tags=["rare"]))) == 2 and len(passing(SearchFilters(date_from=split))) == 40
    assert len(passing(SearchFilters(taken_to=day0 + timedelta(days=10)))) == 7  # 1,2,4,5,7,8,10
    # A backfill dates a photo that had none: the engine's own copy of taken_at follows (Milvus filters it).
    undated = ids[3]
    catalog.set_taken("p", [(undated, day0 + timedelta(days=-5), "mtime")])
    early = SearchFilters(taken_to=day0 - timedelta(days=1))
    assert [h.id for h in catalog.search("p", query, k=10, filters=early)] == [undated]
    assert catalog.get(undated).taken_at == day0 + timedelta(days=-5) and catalog.get(undated).taken_source == "mtime"
    catalog.close()


def test_a_narrow_filter_on_ivf_with_one_probe_still_fills_k(tmp_path, database_url, engine) -> None:
    catalog = open_store(tmp_path, database_url, engine, index_train_min=100, index_nprobe=1)
    catalog.create_collection("c", "texts", "fake", DIM, "IVF16,Flat")
    vectors = random_unit(400, DIM, seed=5)
    texts = [NewText(f"t{i}", tags=["rare"] if i % 33 == 0 else []) for i in range(400)]  # 13 items, many lists
    ids = [r.id for r in catalog.add_texts("c", texts, vectors)]
    settle(catalog, "c")
    rare = [i for i in range(400) if i % 33 == 0]
    query = random_unit(1, DIM, seed=8)[0]
    hits = catalog.search("c", query, k=10, filters=SearchFilters(tags=["rare"]))
    assert [h.id for h in hits] == exact_top([ids[i] for i in rare], vectors[rare], query, 10)[0]
    catalog.close()


def test_deleted_items_leave_search(tmp_path, database_url, engine) -> None:
    catalog = open_store(tmp_path, database_url, engine)
    ids, vectors = fill_texts(catalog, 30)
    assert catalog.delete([ids[4], ids[5], 10_000_000], reason="user", remember=True) == 2
    assert ids[4] not in [h.id for h in catalog.search("c", vectors[4], k=30)]
    assert catalog.get_collection("c").vectors == 28
    catalog.close()
    catalog = open_store(tmp_path, database_url, engine)
    assert list(catalog.index_ids("c")) == ids[:4] + ids[6:]
    catalog.close()


def test_reconcile_repairs_missing_extra_and_emptied_stores(tmp_path, database_url, engine, caplog) -> None:
    catalog = open_store(tmp_path, database_url, engine)
    ids, vectors = fill_texts(catalog, 40)
    store = catalog.store("c").store
    store.remove(np.array(ids[:3]))  # the engine lost ids SQL has
    stale = np.array([ids[-1] + 100, ids[-1] + 101])  # and holds ids SQL never had (or deleted)
    store.upsert(stale, vectors[:2], catalog.rows.attrs(ids[:2]))
    store.save()
    assert store.count() == 39
    catalog.close()

    caplog.clear()  # only what the step below logs

    with caplog.at_level(logging.INFO, logger="indexer.storage.sync"):
        catalog = open_store(tmp_path, database_url, engine)
    lines = sync_lines(caplog)
    assert len(lines) == 1 and "3 added, 2 removed" in lines[0], lines
    assert list(catalog.index_ids("c")) == ids == list(catalog.sql_ids("c"))
    assert catalog.search("c", vectors[1], k=1)[0].id == ids[1]
    store = catalog.store("c").store
    store.remove(np.array(ids))  # emptied
    store.save()
    catalog.close()

    caplog.clear()
    caplog.clear()  # only what the step below logs
    with caplog.at_level(logging.INFO, logger="indexer.storage.sync"):
        catalog = open_store(tmp_path, database_url, engine)
    lines = sync_lines(caplog)
    assert len(lines) == 1 and "40 added, 0 removed" in lines[0], lines
    assert list(catalog.index_ids("c")) == ids
    catalog.close()

    caplog.clear()
    caplog.clear()  # only what the step below logs
    with caplog.at_level(logging.INFO, logger="indexer.storage.sync"):
        catalog = open_store(tmp_path, database_url, engine)
    assert sync_lines(caplog) == []  # consistent: nothing to say
    catalog.close()


def test_engine_data_dropped_entirely_is_rebuilt_from_sql(tmp_path, database_url, engine) -> None:
    catalog = open_store(tmp_path, database_url, engine)
    ids, vectors = fill_texts(catalog, 50)
    if engine.name == "milvus-server":
        client = catalog.vectors.client()  # type: ignore[attr-defined]
        for name in client.list_collections():
            client.drop_collection(name)
    catalog.close()
    data = tmp_path / "data"
    for path in (data / "indexes", data / "milvus.db"):
        assert path.exists() == (path.name == {"faiss": "indexes", "milvus-lite": "milvus.db"}.get(engine.name))
        shutil.rmtree(path, ignore_errors=True)

    catalog = open_store(tmp_path, database_url, engine)
    assert list(catalog.index_ids("c")) == ids
    hits = catalog.search("c", vectors[33], k=3)
    assert [h.id for h in hits] == exact_top(ids, vectors, vectors[33], 3)[0]
    catalog.close()


def test_applying_the_same_changes_twice_adds_nothing(tmp_path, database_url, engine) -> None:
    catalog = open_store(tmp_path, database_url, engine)
    ids, vectors = fill_texts(catalog, 25)
    sync = catalog.store("c")
    again = np.array(ids[:10])
    sync.store.upsert(again, vectors[:10], catalog.rows.attrs(again))
    with sync.lock:
        version, sync.seen = sync.seen, 0  # replay every version: each add is seen twice
        assert sync.catch_up(version) == 25
    assert sync.store.count() == 25
    hits = catalog.search("c", vectors[2], k=25)
    assert len({h.id for h in hits}) == 25 == len(hits) and hits[0].id == ids[2]
    catalog.delete([ids[0]], reason="user", remember=True)
    sync.store.remove(np.array([ids[0]]))  # a removal applied twice is harmless too
    assert sync.store.count() == 24
    catalog.close()


def test_deleting_a_collection_drops_its_engine_data(tmp_path, database_url, engine) -> None:
    catalog = open_store(tmp_path, database_url, engine)
    ids, vectors = fill_texts(catalog, 12)
    state = catalog.collection("c")
    spec = StoreSpec(state.id, state.name, state.dim, state.index, state.model, state.vector_key)
    catalog.flush()
    assert engine_holds(catalog, spec)
    assert catalog.delete_collection("c") == 12
    assert not engine_holds(catalog, spec)
    fill_texts(catalog, 3, seed=7)  # the same name again: none of the old vectors come back
    assert len(catalog.search("c", vectors[0], k=10)) == 3
    catalog.close()


HOLDER = """
import sys, time
from indexer.storage.vectors.milvus.store import MilvusEngine
from indexer.storage.vectors.base import SearchTuning
engine = MilvusEngine(sys.argv[1], "", SearchTuning())
engine.client()
print("holding", flush=True)
time.sleep(120)
"""


def test_a_lite_file_held_by_another_process_is_a_clear_error(tmp_path, database_url) -> None:
    catalog = open_store(tmp_path, database_url, LITE)
    ids, vectors = fill_texts(catalog, 5)
    catalog.close()
    lite = tmp_path / "data" / "milvus.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lite), "--marker-for-the-test"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with pytest.raises(VectorStoreBusy, match=rf"in use by process {holder.pid} \(.*--marker-for-the-test") as err:
            open_store(tmp_path, database_url, LITE)  # a server opens every store at start
        assert err.value.code == "vector_store_busy" and "CNCLIP_MILVUS_URI" in err.value.message
    finally:
        holder.kill()
        holder.wait(timeout=30)
    catalog = open_store(tmp_path, database_url, LITE)  # the holder is gone: the file opens again
    assert catalog.search("c", vectors[0], k=1)[0].id == ids[0]
    catalog.close()
