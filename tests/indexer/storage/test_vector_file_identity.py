"""Issue 21, finding 9: a valid FAISS file of another catalog (same collection name, model, dim and
even the same ids) copied into the data dir is rebuilt from SQL, never adopted: every item's own
vector finds the item itself."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from indexer.domain.records import NewText
from indexer.storage.vectors.faiss.index import VectorIndex
from tests.support.indexer_helpers import catalog_settings, faiss_file, open_test_catalog, random_unit

ITEMS, DIM = 120, 16


def _make_catalog(tmp_path: Path, name: str, seed: int) -> tuple[Path, str, np.ndarray]:
    data_dir, url = tmp_path / name, f"sqlite:///{tmp_path / name / 'catalog.db'}"
    vectors = random_unit(ITEMS, DIM, seed)
    catalog = open_test_catalog(data_dir, url, index_save_interval_s=0)
    try:
        catalog.create_collection("notes", "texts", "fake", DIM)
        catalog.add_texts("notes", [NewText(f"note {i}") for i in range(ITEMS)], vectors)
        catalog.flush(["notes"])
    finally:
        catalog.close()
    return data_dir, url, vectors


def test_another_catalogs_index_file_is_rebuilt_not_adopted(tmp_path: Path) -> None:
    ours_dir, ours_url, ours = _make_catalog(tmp_path, "ours", seed=1)
    theirs_dir, theirs_url, _ = _make_catalog(tmp_path, "theirs", seed=2)
    ours_file = faiss_file(catalog_settings(ours_dir, ours_url), 1)
    theirs_file = faiss_file(catalog_settings(theirs_dir, theirs_url), 1)
    shutil.copyfile(theirs_file, ours_file)  # valid, checksummed, same ids 1..120: only the owner differs

    catalog = open_test_catalog(ours_dir, ours_url)
    try:
        wrong = sum(catalog.search("notes", vector, k=1)[0].id != i + 1 for i, vector in enumerate(ours))
        assert wrong == 0, f"{wrong} of {ITEMS} self-searches returned another item"
        store = catalog.store("notes").store
        assert "another collection or catalog" in (store.problem or ""), store.problem  # type: ignore[attr-defined]
    finally:
        catalog.close()
    key = catalog_vector_key(ours_url)
    assert VectorIndex.load(ours_file, DIM, "Flat", "fake", owner=key).ntotal == ITEMS  # rewritten as ours


def catalog_vector_key(url: str) -> str:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return str(connection.execute(text("SELECT vector_key FROM collections")).scalar_one())
    finally:
        engine.dispose()
