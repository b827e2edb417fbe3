"""FAISS as derived data: reconciled with SQL on open, atomic files, trained factories, re-ranking."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from indexer.domain.records import NewText, SearchFilters
from indexer.storage.vectors.base import SearchTuning
from indexer.storage.vectors.faiss.index import IndexFileError, VectorIndex
from tests.support.indexer_helpers import create_once, faiss_index, open_test_catalog, random_unit

DIM = 16


def fill(catalog, name: str, count: int, seed: int = 0, factory: str = "Flat") -> tuple[list[int], np.ndarray]:
    create_once(catalog, name, "texts", "fake", DIM, factory)
    vectors = random_unit(count, DIM, seed)
    texts = [NewText(f"text {seed} {i}", tags=["even"] if i % 2 == 0 else []) for i in range(count)]
    return [r.id for r in catalog.add_texts(name, texts, vectors)], vectors


def index_file(catalog, name: str) -> Path:
    return catalog.vectors.path(catalog.store(name).store.spec)


def reopen(catalog, tmp_path: Path, database_url: str, **overrides):
    """Simulate a crash: drop the catalog without `close()` (nothing flushed) and open it again."""
    catalog.engine.dispose()
    return open_test_catalog(tmp_path / "data", database_url, **overrides)


def test_missing_and_corrupt_index_files_are_rebuilt(tmp_path, database_url, caplog) -> None:
    catalog = open_test_catalog(tmp_path / "data", database_url)
    ids, _ = fill(catalog, "c", 50)
    catalog.close()
    path = index_file(catalog, "c")

    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte: the checksum catches it
    path.write_bytes(bytes(raw))
    caplog.clear()  # only what the step below logs
    with caplog.at_level(logging.INFO, logger="indexer"):
        catalog = open_test_catalog(tmp_path / "data", database_url)
    rebuilt = [r.message for r in caplog.records if "rebuilt" in r.message]
    assert len(rebuilt) == 1
    assert rebuilt[0].startswith("collection c: vector store rebuilt from SQL (checksum mismatch): 50 added, 0 removed")
    assert list(catalog.index_ids("c")) == ids
    catalog.close()

    path.unlink()
    caplog.clear()  # only what the step below logs
    with caplog.at_level(logging.INFO, logger="indexer"):
        catalog = open_test_catalog(tmp_path / "data", database_url)
    assert len([r for r in caplog.records if "rebuilt" in r.message]) == 1
    assert list(catalog.index_ids("c")) == ids and path.exists()
    catalog.close()


def test_stale_index_is_caught_up_after_a_crash(tmp_path, database_url, caplog) -> None:
    catalog = open_test_catalog(tmp_path / "data", database_url, index_save_interval_s=3600)
    ids, vectors = fill(catalog, "c", 30)
    catalog.flush()
    more, more_vectors = fill(catalog, "c", 20, seed=1)  # committed to SQL, FAISS file not saved
    catalog.delete(ids[:5], reason="user", remember=True)  # deleted in SQL, still in the saved FAISS file
    leftover = index_file(catalog, "c").with_name("1.faiss.tmp-999999-1")
    leftover.write_bytes(b"half a file")  # a save killed before its rename
    caplog.clear()  # only what the step below logs
    with caplog.at_level(logging.INFO, logger="indexer"):
        catalog = reopen(catalog, tmp_path, database_url)
    lines = [r.message for r in caplog.records if r.name == "indexer.storage.sync"]
    assert len(lines) == 1 and "caught up from SQL: 20 added, 5 removed" in lines[0]
    assert list(catalog.index_ids("c")) == ids[5:] + more == list(catalog.sql_ids("c"))
    assert not leftover.exists()
    hit = catalog.search("c", more_vectors[3], k=1)[0]
    assert hit.id == more[3] and hit.score == pytest.approx(1.0, abs=1e-5)
    catalog.close()

    caplog.clear()  # only what the step below logs
    with caplog.at_level(logging.INFO, logger="indexer"):
        catalog = open_test_catalog(tmp_path / "data", database_url)
    assert not [r for r in caplog.records if r.name == "indexer.storage.sync"]  # consistent: nothing to say
    catalog.close()


def test_ivf_is_trained_when_large_enough_and_reranks_exactly(tmp_path, database_url, caplog) -> None:
    settings = {"index_train_min": 200, "index_nprobe": 8, "search_rerank_factor": 4}
    catalog = open_test_catalog(tmp_path / "data", database_url, **settings)
    ids, vectors = fill(catalog, "c", 150, factory="IVF4,Flat")
    index = faiss_index(catalog, "c")
    assert index.active == "Flat"  # too small to train yet
    caplog.clear()  # only what the step below logs
    with caplog.at_level(logging.INFO, logger="indexer"):
        more, more_vectors = fill(catalog, "c", 100, seed=1, factory="IVF4,Flat")
        assert catalog.store("c").store.wait_for_training(60)  # type: ignore[attr-defined]  # trained in the background
    assert index.active == "IVF4,Flat" and any("trained IVF4,Flat" in r.message for r in caplog.records)
    all_ids, all_vectors = np.array(ids + more), np.vstack([vectors, more_vectors])
    query = random_unit(1, DIM, seed=9)[0]
    exact = all_ids[np.argsort(-(all_vectors @ query))[:10]]
    hits = catalog.search("c", query, k=10)
    assert [h.id for h in hits] == list(exact)  # nprobe covers every list, re-rank gives exact scores
    assert [h.score for h in hits] == pytest.approx(sorted(all_vectors @ query, reverse=True)[:10], abs=1e-5)
    even = catalog.search("c", query, k=5, filters=SearchFilters(tags=["even"]))
    expected_even = [i for i in all_ids[np.argsort(-(all_vectors @ query))] if catalog.get(int(i)).tags == ["even"]][:5]
    assert [h.id for h in even] == expected_even
    catalog.close()
    catalog = open_test_catalog(tmp_path / "data", database_url, **settings)
    assert faiss_index(catalog, "c").active == "IVF4,Flat"  # saved trained
    catalog.close()


def test_hnsw_deletes_are_hidden_and_persisted(tmp_path, database_url) -> None:
    catalog = open_test_catalog(tmp_path / "data", database_url, index_train_min=20)
    ids, vectors = fill(catalog, "c", 40, factory="HNSW8")
    assert catalog.store("c").store.wait_for_training(60)  # type: ignore[attr-defined]  # built in the background
    assert faiss_index(catalog, "c").active == "HNSW8"
    catalog.delete(ids[:3], reason="user", remember=True)
    assert catalog.search("c", vectors[0], k=1)[0].id != ids[0]
    assert catalog.get_collection("c").vectors == 37
    catalog.close()
    catalog = open_test_catalog(tmp_path / "data", database_url, index_train_min=20)
    assert list(catalog.index_ids("c")) == ids[3:]
    assert ids[1] not in [h.id for h in catalog.search("c", vectors[1], k=40)]
    catalog.close()


def test_vector_index_file_format(tmp_path: Path) -> None:
    index = VectorIndex(DIM, "Flat", "m", SearchTuning())
    vectors = random_unit(10, DIM)
    index.add(np.arange(100, 110), vectors)
    path = tmp_path / "x.faiss"
    index.save(path)
    assert not list(tmp_path.glob("*.tmp-*"))
    loaded = VectorIndex.load(path, DIM, "Flat", "m")
    assert list(loaded.ids()) == list(range(100, 110))
    ids, scores = loaded.search(vectors[4], 3, fetch=lambda ids: vectors[ids - 100])
    assert ids[0] == 104 and scores[0] == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(IndexFileError, match="another"):
        VectorIndex.load(path, DIM, "Flat", "other-model")
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(IndexFileError, match="truncated"):
        VectorIndex.load(path, DIM, "Flat", "m")


def test_collection_created_by_another_process_is_searchable(tmp_path, database_url) -> None:
    server = open_test_catalog(tmp_path / "data", database_url)
    indexer = open_test_catalog(tmp_path / "data", database_url)  # e.g. `cnclip index` beside `cnclip serve`
    ids, vectors = fill(indexer, "late", 12)
    indexer.close()
    hit = server.search("late", vectors[7], k=1)[0]
    assert hit.id == ids[7] and server.get_collection("late").vectors == 12
    server.close()


def test_only_compressed_indexes_rerank_from_stored_vectors() -> None:
    vectors = random_unit(2000, DIM, seed=4)
    fetched: list[int] = []

    def fetch(ids: np.ndarray) -> np.ndarray:
        fetched.append(len(ids))
        return vectors[ids]

    for factory, reranks in (("IVF8,Flat", False), ("IVF8,PQ4", True)):
        fetched.clear()
        index = VectorIndex(DIM, factory, "m", SearchTuning(train_min=100, nprobe=8, rerank_factor=5))
        index = index.build(np.arange(2000), lambda ids: vectors[ids])
        fetched.clear()
        ids, scores = index.search(vectors[11], 10, fetch)
        assert ids[0] == 11 and scores[0] == pytest.approx(1.0, abs=1e-5)
        assert fetched == ([50] if reranks else [])  # k·r candidates re-scored, or none at all


def test_ids_held_twice_are_held_once_after_a_reconcile(tmp_path, database_url, caplog) -> None:
    """An engine killed mid-write may replay rows (seen with Milvus Lite): reconcile keeps one of each."""
    catalog = open_test_catalog(tmp_path / "data", database_url)
    ids, vectors = fill(catalog, "c", 10)
    sync = catalog.store("c")
    sync.store.index.index.add_with_ids(vectors[:2], np.array(ids[:2], dtype=np.int64))  # a replayed write
    assert len(sync.store.ids()) == 12
    caplog.clear()  # only what the step below logs
    with caplog.at_level(logging.INFO, logger="indexer"), sync.lock:
        sync.reconcile()
    assert sorted(sync.store.ids()) == ids and sync.store.count() == 10
    assert any("2 ids held twice" in r.message for r in caplog.records)
    assert [h.id for h in catalog.search("c", vectors[0], k=2)][0] == ids[0]
    catalog.close()
