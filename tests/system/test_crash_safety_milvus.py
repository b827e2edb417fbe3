"""Kill -9 the bulk indexer at random moments with the Milvus engine (a Milvus Lite file, then the
real Milvus server): after a complete re-run every good file is indexed exactly once, the Milvus
collection holds exactly SQL's ids (read before anything reconciles it) and searches find the right
items. SQLite and PostgreSQL.

Kills land while the indexer commits SQL, while it writes Milvus (Lite's WAL and segments, or its
upserts to the server) and while it flushes at the end. The default suite runs 3 kills per backend;
`-m slow` runs 30.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine

from indexer.storage.sql.db import create_db_engine
from indexer.storage.vectors.base import SearchTuning, StoreSpec
from indexer.storage.vectors.milvus.store import MilvusEngine
from tests.support.crash_trials import GOOD_FILES, assert_found_by_content, kill_trials, make_folder
from tests.support.engines import EngineUnderTest
from tests.support.indexer_helpers import cli_env, open_test_catalog, start_cli, wait_for_items


def milvus_ids_as_left(data_dir: Path, database_url: str, milvus: EngineUnderTest) -> tuple[np.ndarray, np.ndarray]:
    """(ids in the Milvus collection as the last run left it, SQL's ids), nothing reconciled."""
    catalog = open_test_catalog(data_dir / "probe", database_url)  # SQL only: FAISS, another data dir
    state = catalog.collection("photos")
    sql_ids = catalog.sql_ids("photos")
    catalog.close()
    engine = MilvusEngine(milvus.milvus_uri or str(data_dir / "milvus.db"), "", SearchTuning())
    try:
        spec = StoreSpec(state.id, state.name, state.dim, state.index, state.model, state.vector_key)
        store = engine.open(spec, lambda ids: np.zeros((len(ids), state.dim), np.float32), lambda _: np.empty(0))
        return np.sort(store.ids()), sql_ids
    finally:
        engine.close()


def check_consistent(
    tmp_path: Path,
    database_url: str,
    milvus: EngineUnderTest,
    good: list[Path],
    toy_model_dir: Path,
    left_complete: bool = True,
) -> None:
    held, sql_ids = milvus_ids_as_left(tmp_path / "data", database_url, milvus)
    assert len(sql_ids) == GOOD_FILES
    if left_complete:
        assert list(held) == list(sql_ids)  # the complete run's own flush

    catalog = open_test_catalog(tmp_path / "data", database_url, **milvus.overrides())
    try:
        states = catalog.file_states("photos")
        copy = str(good[0].parent / "copy.jpg")
        assert len(states) == GOOD_FILES  # each good file exactly once
        assert set(states) - {copy} <= {str(p) for p in good} and len(set(states) & {copy, str(good[5])}) == 1
        assert len({state.sha256 for state in states.values()}) == GOOD_FILES
        assert list(catalog.index_ids("photos")) == list(sql_ids)
        assert catalog.store("photos").store.count() == GOOD_FILES  # no duplicate primary keys either
        assert_found_by_content(catalog, states, good, toy_model_dir)
    finally:
        catalog.close()


def crash_and_recover(
    tmp_path: Path, database_url: str, milvus: EngineUnderTest, toy_model_dir: Path, trials: int
) -> None:
    good = make_folder(tmp_path / "photos")
    env = cli_env(
        tmp_path / "data",
        database_url,
        toy_model_dir,
        **milvus.env(),
        CNCLIP_INDEX_BATCH_SIZE="4",
        CNCLIP_BUCKETS="[1,4]",
    )
    seen = kill_trials(tmp_path / "photos", env, database_url, trials, seed=trials + 100)
    assert any(0 < n < GOOD_FILES for n in seen), f"no kill landed in the middle of indexing: {seen}"
    final = start_cli(["index", str(tmp_path / "photos"), "--collection", "photos"], env)
    output, _ = final.communicate(timeout=180)
    assert final.returncode == 3, output  # finished; broken.jpg failed (exit status 3)
    assert "failed 1" in output and "broken.jpg" in output
    check_consistent(tmp_path, database_url, milvus, good, toy_model_dir)


def test_sigkill_while_the_milvus_store_is_filled(
    tmp_path: Path, database_url: str, milvus_engine: EngineUnderTest, toy_model_dir: Path
) -> None:
    """Every row committed, the process killed during its final flush into Milvus (opening the Lite
    file, upserting, sealing): the next open finds a Milvus collection that lacks ids, never one with
    ids SQL lacks, and reconciles it to equal SQL."""
    good = make_folder(tmp_path / "photos")
    env = cli_env(tmp_path / "data", database_url, toy_model_dir, **milvus_engine.env(), CNCLIP_BUCKETS="[1,4]")
    engine = create_db_engine(database_url) if database_url.startswith("sqlite") else create_engine(database_url)
    process = start_cli(["index", str(tmp_path / "photos"), "--collection", "photos"], env)
    try:
        assert wait_for_items(engine, process, GOOD_FILES, timeout=120), "the indexer ended before committing"
        time.sleep(random.Random(7).uniform(0.0, 0.3))
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
        engine.dispose()
    held, sql_ids = milvus_ids_as_left(tmp_path / "data", database_url, milvus_engine)
    assert len(sql_ids) == GOOD_FILES and set(held) <= set(sql_ids) and len(set(held)) == len(held)
    check_consistent(tmp_path, database_url, milvus_engine, good, toy_model_dir, left_complete=False)


def test_sigkill_at_random_moments_with_milvus(
    tmp_path: Path, database_url: str, milvus_engine: EngineUnderTest, toy_model_dir: Path
) -> None:
    crash_and_recover(tmp_path, database_url, milvus_engine, toy_model_dir, trials=3)


@pytest.mark.slow
def test_sigkill_soak_with_milvus(
    tmp_path: Path, database_url: str, milvus_engine: EngineUnderTest, toy_model_dir: Path
) -> None:
    crash_and_recover(tmp_path, database_url, milvus_engine, toy_model_dir, trials=30)
