"""`Auto`, the default index of new collections (issue 34 §4): Flat while small, then IVF{≈4√n},Flat
trained in a background thread and swapped in with no failed search, trained again as the collection
grows 4×; a collection stored as Flat stays Flat; a drop or close leaves no training thread behind."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from api.config import Settings
from indexer.domain.index_spec import (
    AUTO,
    FLAT,
    IndexSpec,
    InvalidIndexDescription,
    auto_lists,
    auto_target,
    parse_index,
)
from indexer.domain.records import NewText
from indexer.service.collections import collection_service
from indexer.storage.vectors.base import SearchTuning, StoreSpec
from indexer.storage.vectors.faiss import index as index_module
from indexer.storage.vectors.faiss.index import VectorIndex
from indexer.storage.vectors.faiss.store import FaissEngine, FaissStore
from indexer.storage.vectors.milvus.plan import AUTO_NLIST, LITE, IndexPlan, plan_index, server_capabilities
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import catalog_settings, faiss_index, open_test_catalog, unit

ROOT = Path(__file__).resolve().parents[5]
DIM = 64
SWITCH_AT = 2_000  # CNCLIP_INDEX_AUTO_IVF_MIN for these tests: small, so they are fast


def clustered(count: int, seed: int, centres: int = 50) -> np.ndarray:
    """Unit vectors around a few fixed centres, as real embeddings are (same centres for every seed)."""
    middle = unit(np.random.default_rng(1234).standard_normal((centres, DIM)))
    rng = np.random.default_rng(seed)
    return unit(middle[rng.integers(0, centres, count)] + 0.08 * rng.standard_normal((count, DIM)))


def training_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("cnclip-train-")]


@pytest.fixture
def no_thread_left() -> Iterator[None]:
    yield
    assert not training_threads(), "a training thread outlived its store"


class GatedTraining:
    """Holds FAISS training (`VectorIndex._trained`) until released, so a test acts while it runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        real = VectorIndex._trained

        def gated(index: VectorIndex, *args: object) -> object:
            self.entered.set()
            assert self.release.wait(30), "the test never released training"
            return real(index, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(VectorIndex, "_trained", gated)


def test_auto_is_the_default_for_new_collections_and_is_documented() -> None:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.index_factory == "Auto"
    assert parse_index(settings.index_factory).kind == "auto"
    assert "| `CNCLIP_INDEX_FACTORY` | `Auto` |" in (ROOT / "docs/settings.md").read_text()
    indexing = (ROOT / "docs/indexing.md").read_text()
    assert "CNCLIP_INDEX_AUTO_IVF_MIN" in indexing and "benchmarks/bench_auto_index.py" in indexing


def test_auto_lists_double_when_the_collection_has_grown_fourfold() -> None:
    assert auto_lists(100_000) == 1265 and auto_lists(20_000) == 512  # 4·√n, at most n/39
    assert auto_target(19_999, FLAT, flat_up_to=20_000) is None  # Flat below the measured size
    trained = auto_target(100_000, FLAT, flat_up_to=20_000)
    assert trained == IndexSpec("ivf_flat", lists=1265)
    assert auto_target(390_000, trained, flat_up_to=20_000) is None  # 3.9×: keeps its lists
    assert auto_target(400_000, trained, flat_up_to=20_000) == IndexSpec("ivf_flat", lists=2530)
    assert auto_target(10**9, IndexSpec("hnsw", links=32), flat_up_to=1) is None  # never Auto's: left alone


def test_crossing_the_auto_size_switches_to_ivf_with_no_failed_search(
    tmp_path: Path,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    no_thread_left: None,
) -> None:
    gate = GatedTraining(monkeypatch)
    # nprobe from 4: Auto's measured depth has a ladder to climb (4, 8, 13 of 53 lists).
    settings = {"index_auto_ivf_min": SWITCH_AT, "index_nprobe": 4}
    catalog = open_test_catalog(tmp_path / "data", database_url, **settings)
    # Made as the API and `cnclip index` make one: no index named, the settings' default (Auto).
    service = collection_service(catalog, FakeEncoder(dim=DIM), catalog_settings(tmp_path / "data", database_url))
    assert service.create("c", "texts").index == "Auto"
    vectors: dict[int, np.ndarray] = {}

    def add(count: int, seed: int) -> None:
        batch = clustered(count, seed)
        texts = [NewText(f"text {seed} {i}") for i in range(count)]
        for result, vector in zip(catalog.add_texts("c", texts, batch), batch, strict=True):
            vectors[result.id] = vector

    add(SWITCH_AT - 100, seed=0)
    index = faiss_index(catalog, "c")
    assert index.active == "Flat"

    stop, failures, empty, seen = threading.Event(), [], [], set()
    queries = clustered(64, seed=99)

    def search_forever() -> None:
        turn = 0
        while not stop.is_set():
            seen.add(index.active)
            try:
                hits = catalog.search("c", queries[turn % len(queries)], k=10)
            except Exception as exc:  # noqa: BLE001 - any failure is what this test counts
                failures.append(repr(exc))
            else:
                if len(hits) < 10:
                    empty.append(len(hits))
            turn += 1

    searcher = threading.Thread(target=search_forever)
    searcher.start()
    try:
        with caplog.at_level(logging.INFO, logger="indexer"):
            add(200, seed=1)  # crosses SWITCH_AT: the build starts in the background
            assert gate.entered.wait(30), "crossing the Auto size started no training"
            assert index.active == "Flat"  # building: searches go on against Flat
            before = len(seen) + _count_searches(catalog, queries[0], 5)
            add(300, seed=2)  # writes go on too, and must reach the new index
            gone = list(vectors)[:7]
            catalog.delete(gone, reason="user", remember=False)
            for item_id in gone:
                vectors.pop(item_id)
            gate.release.set()
            assert catalog.store("c").store.wait_for_training(60)  # type: ignore[attr-defined]
            assert before > 0
            _wait_until(lambda: index.active in seen)  # the searcher goes on after the swap too
    finally:
        stop.set()
        searcher.join(30)

    expected_lists = auto_lists(SWITCH_AT + 100)
    assert index.active == f"IVF{expected_lists},Flat"
    assert failures == [] and empty == []
    assert {"Flat", index.active} <= seen  # the searcher ran before and after the swap
    assert index.nprobe is not None and index.nprobe < expected_lists  # measured, not every list
    assert any("300 added, 7 removed meanwhile" in r.getMessage() for r in caplog.records)
    assert sorted(catalog.index_ids("c")) == sorted(vectors)  # caught up: nothing lost, nothing kept
    assert _recall_at_10(catalog, vectors, clustered(100, seed=7)) >= 0.95

    catalog.close()
    reopened = open_test_catalog(tmp_path / "data", database_url, **settings)
    try:
        assert faiss_index(reopened, "c").active == f"IVF{expected_lists},Flat"  # saved as IVF
        assert faiss_index(reopened, "c").nprobe == index.nprobe  # with its measured depth
        assert _recall_at_10(reopened, vectors, clustered(100, seed=8)) >= 0.95
    finally:
        reopened.close()


def test_auto_trains_again_once_the_collection_has_grown_fourfold(tmp_path: Path, no_thread_left: None) -> None:
    engine, store, data = _store(tmp_path, auto_ivf_min=SWITCH_AT)
    try:
        _upsert(store, data, 0, SWITCH_AT)
        assert store.wait_for_training(60)
        first = auto_lists(SWITCH_AT)
        assert store.index.active == f"IVF{first},Flat"
        # Small collections are capped at 39 points a list, so the lists double at 2× here (4× above ~25k:
        # test_auto_lists_double_when_the_collection_has_grown_fourfold).
        grown = next(n for n in range(SWITCH_AT, 4 * SWITCH_AT) if auto_lists(n) >= 2 * first)
        assert grown > 1.9 * SWITCH_AT
        _upsert(store, data, SWITCH_AT, grown - 1)
        assert store.wait_for_training(60) and store.index.active == f"IVF{first},Flat"  # not grown enough yet
        _upsert(store, data, grown - 1, grown)
        assert store.wait_for_training(60)
        assert store.index.active == f"IVF{auto_lists(grown)},Flat" and auto_lists(grown) >= 2 * first
    finally:
        store.close()
        engine.close()


def test_a_stored_flat_collection_stays_flat(tmp_path: Path, no_thread_left: None) -> None:
    engine, store, data = _store(tmp_path, auto_ivf_min=SWITCH_AT, factory="Flat")
    try:
        _upsert(store, data, 0, 2 * SWITCH_AT)
        assert not store.training and store.index.active == "Flat"
    finally:
        store.close()
        engine.close()


def test_close_waits_for_the_build_and_saves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_thread_left: None
) -> None:
    gate = GatedTraining(monkeypatch)
    engine, store, data = _store(tmp_path, auto_ivf_min=SWITCH_AT)
    _upsert(store, data, 0, SWITCH_AT)
    assert gate.entered.wait(30)
    threading.Timer(0.2, gate.release.set).start()
    store.close()  # returns only once the build is swapped in and saved
    assert store.index.active == f"IVF{auto_lists(SWITCH_AT)},Flat"
    engine.close()
    engine, reopened, _ = _store(tmp_path, auto_ivf_min=SWITCH_AT)
    try:
        assert reopened.index.active == f"IVF{auto_lists(SWITCH_AT)},Flat" and reopened.count() == SWITCH_AT
    finally:
        reopened.close()
        engine.close()


def test_dropping_a_collection_stops_its_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, no_thread_left: None
) -> None:
    gate = GatedTraining(monkeypatch)
    engine, store, data = _store(tmp_path, auto_ivf_min=SWITCH_AT)
    _upsert(store, data, 0, SWITCH_AT)
    assert gate.entered.wait(30) and store.training

    def release_once_cancelled() -> None:
        _wait_until(lambda: store._cancel_training.is_set())
        gate.release.set()

    threading.Thread(target=release_once_cancelled).start()
    with caplog.at_level(logging.INFO, logger="indexer"):
        engine.drop(store.spec)  # cancels, waits for the thread, then removes the file
    assert not store.training and store.index.active == "Flat"  # never swapped in
    assert any("training stopped" in r.getMessage() for r in caplog.records)
    assert not engine.path(store.spec).exists()
    _upsert(store, data, SWITCH_AT, SWITCH_AT + 10)
    assert not store.training  # a dropped collection's store starts no build
    engine.close()


def test_a_failed_build_keeps_the_index_in_use_and_backs_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, no_thread_left: None
) -> None:
    def refuses(index: VectorIndex, *args: object) -> object:
        raise OSError("the database went away")  # not FAISS's own refusal: any failure in the thread

    monkeypatch.setattr(VectorIndex, "_trained", refuses)
    engine, store, data = _store(tmp_path, auto_ivf_min=SWITCH_AT)
    try:
        with caplog.at_level(logging.INFO, logger="indexer"):
            _upsert(store, data, 0, SWITCH_AT)
            assert store.wait_for_training(60)
        assert store.index.active == "Flat" and store.index.training_failed_at == SWITCH_AT
        assert any("training on 2000 vectors failed" in r.getMessage() for r in caplog.records)
        ids, _ = store.search(data[5], 10)
        assert ids[0] == 6  # still searched, exactly
        _upsert(store, data, SWITCH_AT, 2 * SWITCH_AT - 1)
        assert not store.training  # backs off until twice as many
    finally:
        store.close()
        engine.close()


def test_a_loaded_auto_file_must_hold_an_index_auto_builds(tmp_path: Path) -> None:
    index = VectorIndex(DIM, "Auto", "m", SearchTuning(auto_ivf_min=1))
    data = clustered(500, seed=3)
    built = index.build(np.arange(1, 501, dtype=np.int64), lambda ids: data[ids - 1])
    assert built.active == f"IVF{auto_lists(500)},Flat"
    built.active = "HNSW32"  # a header no Auto collection writes
    built.save(tmp_path / "c.faiss")
    with pytest.raises(index_module.IndexFileError, match="which Auto never builds"):
        VectorIndex.load(tmp_path / "c.faiss", DIM, "Auto", "m")


# --- helpers ------------------------------------------------------------------------------------


def _count_searches(catalog: object, query: np.ndarray, times: int) -> int:
    """Searches run from this thread while the build is held: each must answer in full."""
    answered = 0
    for _ in range(times):
        answered += len(catalog.search("c", query, k=10)) == 10  # type: ignore[attr-defined]
    return answered


def _recall_at_10(catalog: object, vectors: dict[int, np.ndarray], queries: np.ndarray) -> float:
    ids = np.fromiter(vectors, dtype=np.int64)
    matrix = np.stack([vectors[i] for i in ids])
    hits = 0
    for query in queries:
        exact = set(ids[np.argsort(-(matrix @ query))[:10]].tolist())
        hits += len(exact & {h.id for h in catalog.search("c", query, k=10)})  # type: ignore[attr-defined]
    return hits / (10 * len(queries))


def _store(tmp_path: Path, auto_ivf_min: int, factory: str = "Auto") -> tuple[FaissEngine, FaissStore, np.ndarray]:
    """A FAISS store over `clustered` vectors (id i is row i-1), as the catalog opens one."""
    data = clustered(4 * SWITCH_AT, seed=11)
    engine = FaissEngine(tmp_path / "indexes", SearchTuning(auto_ivf_min=auto_ivf_min, nprobe=64), 30.0)
    spec = StoreSpec(1, "c", DIM, factory, "m", "key")
    store = engine.open(spec, lambda ids: data[np.asarray(ids) - 1], lambda _f: np.empty(0, np.int64))
    return engine, store, data


def _upsert(store: FaissStore, data: np.ndarray, start: int, stop: int) -> None:
    ids = np.arange(start + 1, stop + 1, dtype=np.int64)
    store.upsert(ids, data[ids - 1], [])


def _wait_until(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_removing_from_a_trained_ivf_keeps_every_other_label_right() -> None:
    # IndexIDMap2 over an IVF shifted labels after remove_ids: a search for id 600 answered 605.
    data = clustered(2_000, seed=4)
    ids = np.arange(100, 2_100, dtype=np.int64)
    fetch = lambda wanted: data[np.asarray(wanted) - 100]  # noqa: E731
    for factory in ("IVF8,Flat", "Auto"):
        index = VectorIndex(DIM, factory, "m", SearchTuning(train_min=1, auto_ivf_min=1, nprobe=8)).build(ids, fetch)
        assert index.active != "Flat", factory
        index.remove(ids[:5])
        for wanted in (600, 1_500, 2_099):
            found, _ = index.search(data[wanted - 100], 1, fetch)
            assert found[0] == wanted, factory
        assert index.ntotal == 1_995 and 100 not in index.ids()


def test_auto_stays_flat_where_ivf_cannot_reach_the_recall(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, no_thread_left: None
) -> None:
    data = unit(np.random.default_rng(5).standard_normal((SWITCH_AT, DIM)))  # no structure at all
    ids = np.arange(1, SWITCH_AT + 1, dtype=np.int64)
    index = VectorIndex(DIM, "Auto", "m", SearchTuning(auto_ivf_min=SWITCH_AT, nprobe=1))
    with caplog.at_level(logging.INFO, logger="indexer"):
        built = index.build(ids, lambda wanted: data[np.asarray(wanted) - 1])
    assert built.active == "Flat" and built.ntotal == SWITCH_AT  # every vector kept, searched exactly
    assert index.training_failed_at == SWITCH_AT and not index.wants_training(2 * SWITCH_AT - 1)
    assert any("visiting a quarter of its lists" in r.getMessage() for r in caplog.records)
    found, _ = built.search(data[9], 1, lambda wanted: data[np.asarray(wanted) - 1])
    assert found[0] == 10


def test_auto_rebuilds_once_a_quarter_of_its_vectors_are_removed(tmp_path: Path, no_thread_left: None) -> None:
    engine, store, data = _store(tmp_path, auto_ivf_min=SWITCH_AT)
    try:
        _upsert(store, data, 0, 3 * SWITCH_AT)
        assert store.wait_for_training(60) and store.index.active != "Flat"
        store.remove(np.arange(1, SWITCH_AT // 2, dtype=np.int64))  # hidden, still scanned
        assert store.index.tombstones and not store.training
        store.remove(np.arange(SWITCH_AT // 2, SWITCH_AT + 1, dtype=np.int64))  # past a quarter of what is left
        _upsert(store, data, 3 * SWITCH_AT, 3 * SWITCH_AT + 1)  # the next write starts the rebuild
        assert store.wait_for_training(60)
        assert not store.index.tombstones and store.count() == 2 * SWITCH_AT + 1
    finally:
        store.close()
        engine.close()


def test_milvus_maps_auto_to_one_ivf_flat_on_lite_and_servers() -> None:
    # Milvus indexes each sealed segment by itself: no Flat phase, one nlist (indexer/storage/vectors/milvus/plan.py).
    for supports in (LITE, server_capabilities("v2.3.5"), server_capabilities("v2.5.4")):
        assert plan_index("Auto", DIM, supports) == IndexPlan("IVF_FLAT", {"nlist": AUTO_NLIST})


def test_auto_is_one_word_of_the_grammar() -> None:
    assert parse_index("Auto") == AUTO and AUTO.description == "Auto" and AUTO.needs_training
    for wrong in ("auto", "AUTO", "Auto,Flat", "AutoIVF", " Auto", "Auto64"):
        with pytest.raises(InvalidIndexDescription, match="or Auto"):
            parse_index(wrong, DIM)
