"""Fixtures of the `--ray` system tests (tests/system/test_ray_*.py): a two-node cluster per module and
the two catalogs issue 33 names (SQLite with FAISS, PostgreSQL with the Milvus server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.indexer_helpers import cli_env
from tests.support.ray_cluster import local_cluster, top_up


@pytest.fixture(scope="module")
def two_node_cluster() -> Iterator[Any]:
    """Two nodes, started once per module (a start costs ~12 s on 2 cores)."""
    with local_cluster(nodes=2) as started:
        yield started


@pytest.fixture
def cluster(two_node_cluster: Any) -> Any:
    """The module's cluster with its two nodes (again, after a test removed one)."""
    top_up(two_node_cluster, nodes=2)
    return two_node_cluster


# Both in the default suite (issue 33 asks for SQLite and for PostgreSQL with a Milvus server).
@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=[pytest.mark.postgres, pytest.mark.milvus_server]),
    ]
)
def ray_catalog(
    request: pytest.FixtureRequest, tmp_path: Path, toy_model_dir: Path
) -> Iterator[tuple[str, dict[str, str]]]:
    """(database URL, `cnclip` environment): SQLite with FAISS, or PostgreSQL with the Milvus server."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'catalog.db'}"
        yield url, cli_env(tmp_path / "data", url, toy_model_dir)
        return
    from tests.support.postgres import fresh_schema

    uri = request.getfixturevalue("milvus_server_uri")
    with fresh_schema() as url:
        yield url, cli_env(tmp_path / "data", url, toy_model_dir, CNCLIP_VECTOR_STORE="milvus", CNCLIP_MILVUS_URI=uri)
