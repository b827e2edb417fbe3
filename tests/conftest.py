"""Fixtures shared by every test module. Nothing here downloads anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrieval.config import Settings
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
