"""Kill -9 the bulk indexer at random moments; after a re-run every good file is indexed exactly once,
the FAISS file's ids equal SQL's and searches find the right items. On SQLite and PostgreSQL.

The default suite runs 3 kills per backend (6 in all); `pytest -m slow tests/system/test_crash_safety.py` runs 30 each.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from api.config import Settings
from indexer.storage.vectors.faiss.index import VectorIndex
from tests.support.crash_trials import GOOD_FILES, assert_found_by_content, kill_trials, make_folder
from tests.support.indexer_helpers import cli_env, faiss_file, open_test_catalog, start_cli


def check_consistent(tmp_path: Path, database_url: str, good: list[Path], toy_model_dir: Path) -> None:
    settings = Settings(_env_file=None, data_dir=tmp_path / "data", database_url=database_url)
    # The complete run's own FAISS file, read before anything reconciles it, equals SQL.
    catalog = open_test_catalog(tmp_path / "probe", database_url)
    info = catalog.get_collection("photos")
    sql_ids = catalog.sql_ids("photos")
    catalog.engine.dispose()
    path = faiss_file(settings, info.id)
    saved = VectorIndex.load(path, info.dim, info.index, info.model)
    assert np.array_equal(np.sort(saved.ids()), sql_ids)

    catalog = open_test_catalog(tmp_path / "data", database_url)
    try:
        states = catalog.file_states("photos")
        indexed = set(states)
        copy = str(good[0].parent / "copy.jpg")
        assert len(indexed) == GOOD_FILES == len(sql_ids)  # each good file exactly once
        assert indexed - {copy} <= {str(p) for p in good} and len(indexed & {copy, str(good[5])}) == 1
        assert len({state.sha256 for state in states.values()}) == GOOD_FILES
        assert list(catalog.index_ids("photos")) == list(sql_ids)
        assert_found_by_content(catalog, states, good, toy_model_dir)
    finally:
        catalog.close()


def crash_and_recover(tmp_path: Path, database_url: str, toy_model_dir: Path, trials: int) -> None:
    good = make_folder(tmp_path / "photos")
    env = cli_env(tmp_path / "data", database_url, toy_model_dir, CNCLIP_INDEX_BATCH_SIZE="4", CNCLIP_BUCKETS="[1,4]")
    seen = kill_trials(tmp_path / "photos", env, database_url, trials, seed=trials)
    assert any(0 < n < GOOD_FILES for n in seen), f"no kill landed in the middle of indexing: {seen}"
    final = start_cli(["index", str(tmp_path / "photos"), "--collection", "photos"], env)
    output, _ = final.communicate(timeout=180)
    assert final.returncode == 3, output  # finished; broken.jpg failed (exit status 3)
    assert "failed 1" in output and "broken.jpg" in output
    check_consistent(tmp_path, database_url, good, toy_model_dir)


def test_sigkill_at_random_moments(tmp_path: Path, database_url: str, toy_model_dir: Path) -> None:
    crash_and_recover(tmp_path, database_url, toy_model_dir, trials=3)


@pytest.mark.slow
def test_sigkill_soak(tmp_path: Path, database_url: str, toy_model_dir: Path) -> None:
    crash_and_recover(tmp_path, database_url, toy_model_dir, trials=30)
