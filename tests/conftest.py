"""Fixtures shared by every test module. Nothing here downloads anything."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from api.config import Settings
from retrieval.toolchain.toy_model import write_toy_model
from tests.support.engines import MILVUS_SERVER, EngineUnderTest, engine_under_test

# `--record-venv-tests` / `--only-venv-tests`: .ci/run's venv run repeats the tests a venv can fail.
pytest_plugins = ["tests.support.venv_tests"]

if TYPE_CHECKING:  # the catalog fixture imports it when a test asks: most tests need no database
    from indexer.storage.catalog import SqlCatalog

# The default run pairs each Milvus engine with one database, not both: the real server with
# PostgreSQL (a deployment's pairing), Milvus Lite with SQLite (a single machine's); FAISS keeps both.
# Every database and every engine still runs; the cross product runs in `make test-all`. It keeps the
# default suite inside CI's time (the server tests are the slowest), and is one rule, here.
CROSS_PRODUCT_ONLY = {("sqlite", "milvus-server"), ("postgresql", "milvus-lite")}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the database × engine pairs in `CROSS_PRODUCT_ONLY` slow (before `-m` deselects)."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        engine = params.get("engine", params.get("milvus_engine"))
        if (params.get("database_url"), engine) in CROSS_PRODUCT_ONLY:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def toy_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model directory with the runtime's real interface (see retrieval/toolchain/toy_model.py)."""
    directory = tmp_path_factory.mktemp("toy-model")
    write_toy_model(directory)
    return directory


@pytest.fixture(scope="session")
def next_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second toy model (16-d, other weights, no int8 files): the model a migration moves a collection to."""
    directory = tmp_path_factory.mktemp("toy-next")
    write_toy_model(directory, dim=16, seed=5, name="toy-next", int8=False)
    return directory


@pytest.fixture
def settings(tmp_path: Path, toy_model_dir: Path) -> Settings:
    """Settings on an empty data dir and the toy model, ignoring the caller's CNCLIP_* environment."""
    return Settings(_env_file=None, model_dir=toy_model_dir, data_dir=tmp_path / "data", provider="cpu")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database on each backend: a SQLite file, or a fresh PostgreSQL schema dropped afterwards.
    PostgreSQL (127.0.0.1:5432, database `test`) must be reachable: without it these tests fail."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'db' / 'catalog.db'}"
        return
    from tests.support.postgres import fresh_schema

    with fresh_schema() as url:
        yield url


@pytest.fixture
def catalog(database_url: str, tmp_path: Path) -> Iterator[SqlCatalog]:
    """A catalog on each database in turn (its FAISS files under the test's `data`), closed afterwards."""
    from tests.support.indexer_helpers import open_test_catalog

    opened = open_test_catalog(tmp_path / "data", database_url)
    yield opened
    opened.close()


@pytest.fixture(scope="session")
def python_repo(toy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy model exported with `--backend python --max-batch 16`: what the real Triton serves."""
    from retrieval.toolchain.triton.export import ExportOptions, export_triton_repository

    out = tmp_path_factory.mktemp("triton-python") / "repo"
    export_triton_repository(toy_model_dir, out, ExportOptions(backend="python", max_batch=16, queue_delay_us=2000))
    return out


@pytest.fixture(autouse=True)
def project_log_levels() -> Iterator[None]:
    """Every `cnclip` command run in-process sets the project loggers' levels (cli/log_setup.py);
    put them back, so that no test depends on which command another test ran before it."""
    import logging

    from cli.log_setup import PROJECT_LOGGERS

    levels = {name: logging.getLogger(name).level for name in PROJECT_LOGGERS}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.fixture(scope="session")
def milvus_server() -> Iterator[Any]:
    """The real Milvus server (tests/support/real_milvus.py), started once per test run when a test asks."""
    from tests.support.real_milvus import RealMilvus, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with RealMilvus() as server:
        yield server


@pytest.fixture
def milvus_server_uri(milvus_server: Any) -> Iterator[str]:
    """The server's URI; every collection a test made is dropped after it (one server, many tests)."""
    yield milvus_server.uri
    milvus_server.drop_every_collection()


@pytest.fixture(scope="module")
def module_milvus_server_uri(milvus_server: Any) -> Iterator[str]:
    """The same for a module-scoped fixture (a library its tests share): dropped after the module."""
    yield milvus_server.uri
    milvus_server.drop_every_collection()


@pytest.fixture(params=["faiss", "milvus-lite", MILVUS_SERVER])
def engine(request: pytest.FixtureRequest) -> EngineUnderTest:
    """Each vector engine in turn."""
    return engine_under_test(request, str(request.param))


@pytest.fixture(params=["milvus-lite", MILVUS_SERVER])
def milvus_engine(request: pytest.FixtureRequest) -> EngineUnderTest:
    """Milvus Lite, then the real Milvus server."""
    return engine_under_test(request, str(request.param))
