"""Fixtures shared by every test module. Nothing here downloads anything."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from api.config import Settings
from retrieval.toy_model import write_toy_model


@pytest.fixture(scope="session")
def toy_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model directory with the runtime's real interface (see retrieval/toy_model.py)."""
    directory = tmp_path_factory.mktemp("toy-model")
    write_toy_model(directory)
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
    from tests.postgres import fresh_schema

    with fresh_schema() as url:
        yield url


@pytest.fixture(scope="session")
def python_repo(toy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy model exported with `--backend python --max-batch 16`: what the real Triton serves."""
    from retrieval.triton_export import ExportOptions, export_triton_repository

    out = tmp_path_factory.mktemp("triton-python") / "repo"
    export_triton_repository(toy_model_dir, out, ExportOptions(backend="python", max_batch=16, queue_delay_us=2000))
    return out


@pytest.fixture(autouse=True)
def project_log_levels() -> Iterator[None]:
    """Every `cnclip` command run in-process sets the project loggers' levels (api/cli_logging.py);
    put them back, so that no test depends on which command another test ran before it."""
    import logging

    from api.cli_logging import PROJECT_LOGGERS

    levels = {name: logging.getLogger(name).level for name in PROJECT_LOGGERS}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
