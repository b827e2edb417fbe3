"""A catalog adding to a collection keeps its FAISS file and appends to its log; a log cut short by a
crash costs only a catch-up from SQL on the next open; dropping a collection removes its log too."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from indexer.domain.records import NewText
from indexer.storage.catalog import SqlCatalog
from indexer.storage.vectors.faiss.delta import delta_path
from tests.support.indexer_helpers import create_once, open_test_catalog, random_unit

DIM = 16


def _add(catalog: SqlCatalog, first: int, count: int) -> list[int]:
    create_once(catalog, "c", "texts", "fake", DIM)
    texts = [NewText(f"text {n}") for n in range(first, first + count)]
    return [r.id for r in catalog.add_texts("c", texts, random_unit(count, DIM, seed=first))]


def _index_file(catalog: SqlCatalog) -> Path:
    return catalog.vectors.path(catalog.store("c").store.spec)  # type: ignore[attr-defined]


def test_adding_to_a_collection_appends_and_a_torn_log_is_caught_up_from_sql(
    tmp_path: Path, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    catalog = open_test_catalog(tmp_path / "data", database_url)
    ids = _add(catalog, 0, 3000)
    path = _index_file(catalog)
    catalog.close()
    base = os.stat(path)

    catalog = open_test_catalog(tmp_path / "data", database_url)
    ids += _add(catalog, 3000, 200)
    catalog.close()
    assert os.stat(path).st_ino == base.st_ino and os.stat(path).st_mtime_ns == base.st_mtime_ns
    whole = delta_path(path).stat().st_size

    catalog = open_test_catalog(tmp_path / "data", database_url)
    ids += _add(catalog, 3200, 50)
    catalog.close()
    with open(delta_path(path), "r+b") as log:  # a crash in the middle of the second append
        log.truncate(whole + 100)

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="indexer"):
        catalog = open_test_catalog(tmp_path / "data", database_url)
        catalog.reconcile_all()
    assert np.array_equal(catalog.index_ids("c"), np.array(sorted(ids)))
    repaired = [r.getMessage() for r in caplog.records if "from SQL" in r.getMessage()]
    assert len(repaired) == 1 and "caught up from SQL: 50 added, 0 removed" in repaired[0], repaired

    catalog.delete_collection("c")
    assert not path.exists() and not delta_path(path).exists()
    catalog.close()
