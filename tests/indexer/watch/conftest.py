"""The catalogs the watcher tests index into."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from indexer.storage.catalog import SqlCatalog
from tests.support.indexer_helpers import open_test_catalog


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[SqlCatalog]:
    """On SQLite, under the test's data dir."""
    opened = open_test_catalog(tmp_path / "data", f"sqlite:///{tmp_path / 'data' / 'catalog.db'}")
    yield opened
    opened.close()


@pytest.fixture
def any_catalog(tmp_path: Path, database_url: str) -> Iterator[SqlCatalog]:
    """On SQLite, then on PostgreSQL."""
    opened = open_test_catalog(tmp_path / "data", database_url)
    yield opened
    opened.close()
