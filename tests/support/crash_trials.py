"""The kill -9 trials shared by the crash-safety tests of each vector engine (tests/system/test_crash_safety*.py):
a folder to index, the indexer killed at random moments, and the search check after the complete re-run."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path

import numpy as np
from sqlalchemy import create_engine

from api.config import Settings
from indexer.domain.records import FileState
from indexer.storage.catalog import SqlCatalog
from indexer.storage.sql.db import create_db_engine
from retrieval.encoder import create_encoder
from tests.support.indexer_helpers import committed_items, jpeg, start_cli, write_images

GOOD_FILES = 48  # the folder also holds a broken file and a copy of one of them
# Photos of some size, so that indexing them takes a while (~2.5 ms of decoding each, not 0.8): a kill
# aimed at the middle of the run has room to land there on a loaded runner.
PHOTO_SIZE = (320, 240)


def make_folder(folder: Path) -> list[Path]:
    """GOOD_FILES distinct photos, a broken JPEG and a byte copy of the sixth photo; the good ones."""
    good = write_images(folder, GOOD_FILES, PHOTO_SIZE)
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
        # A moment within the next batch or so: the toy model indexes fast, and a kill up to 50 ms
        # after the target once came after the last commit (seed 103 on a 2-core runner: [48, 48, 48]).
        time.sleep(rng.uniform(0, 0.01))
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
        seen.append(committed_items(engine))
    engine.dispose()
    return seen


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
    vectors = asyncio.run(embed([jpeg(i, PHOTO_SIZE) for i in probes]))
    for i, vector in zip(probes, vectors, strict=True):
        top = catalog.search("photos", vector, k=1)[0]
        assert catalog.get(top.id).sha256 == states[str(good[i])].sha256 and top.score > 0.999
