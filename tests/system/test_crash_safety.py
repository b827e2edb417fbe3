"""Kill -9 the bulk indexer at random moments; after a re-run every good file is indexed exactly once,
the FAISS file's ids equal SQL's and searches find the right items. On SQLite and PostgreSQL.

The default suite runs 3 kills per backend (6 in all); `pytest -m slow tests/system/test_crash_safety.py` runs 30 each.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine

from api.config import Settings
from indexer.domain.records import FileState
from indexer.storage.catalog import SqlCatalog
from indexer.storage.sql.db import create_db_engine
from indexer.storage.vectors.faiss.index import VectorIndex
from retrieval.encoder import create_encoder
from tests.support.indexer_helpers import (
    cli_env,
    committed_items,
    faiss_file,
    jpeg,
    open_test_catalog,
    start_cli,
    write_images,
)

GOOD_FILES = 48


def make_folder(folder: Path) -> list[Path]:
    good = write_images(folder, GOOD_FILES)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    (folder / "copy.jpg").write_bytes(good[5].read_bytes())
    return good


def kill_trials(folder: Path, env: dict[str, str], database_url: str, trials: int, seed: int) -> list[int]:
    """Start the indexer `trials` times and SIGKILL it at a random moment; returns rows seen at each kill."""
    rng = random.Random(seed)
    engine = create_db_engine(database_url) if database_url.startswith("sqlite") else create_engine(database_url)
    seen = []
    for trial in range(trials):
        # Every other run saves FAISS after each batch, so kills also land in the middle of a save.
        trial_env = {**env, "CNCLIP_INDEX_SAVE_INTERVAL_S": "0" if trial % 2 else "3600"}
        process = start_cli(["index", str(folder), "--collection", "photos"], trial_env)
        before = committed_items(engine)
        target = before + rng.randint(0, 10)  # 0: killed while starting up or reconciling
        deadline = time.monotonic() + 60
        while committed_items(engine) < target and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
        seen.append(committed_items(engine))
    engine.dispose()
    return seen


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


def assert_found_by_content(
    catalog: SqlCatalog, states: dict[str, FileState], good: list[Path], toy_model_dir: Path
) -> None:
    """Three of the indexed photos, embedded afresh, find themselves first."""

    async def embed(images: list[bytes]) -> np.ndarray:
        encoder = create_encoder(Settings(_env_file=None, model_dir=toy_model_dir, provider="cpu"))
        await encoder.start()
        try:
            return await encoder.embed_images(images)
        finally:
            await encoder.close()

    probes = [0, 17, GOOD_FILES - 1]
    vectors = asyncio.run(embed([jpeg(i, (16, 16)) for i in probes]))
    for i, vector in zip(probes, vectors, strict=True):
        top = catalog.search("photos", vector, k=1)[0]
        assert catalog.get(top.id).sha256 == states[str(good[i])].sha256 and top.score > 0.999


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
