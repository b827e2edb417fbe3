"""What the hostile-settings tests share (tests/system/test_hostile_settings.py, test_hostile_runtime.py):
a toy model to spoil, a spoiled copy of it, the environment `cnclip` runs in, and their limits."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from retrieval.machine_limits import usable_cores
from retrieval.toolchain.toy_model import write_toy_model
from tests.support.indexer_helpers import cli_env

CORES = usable_cores()
RUN_TIMEOUT_S = 120  # a hang fails the test instead of the suite


def toy_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small toy model, copied by each case that spoils it."""
    model = tmp_path_factory.mktemp("hostile") / "model"
    write_toy_model(model, buckets=(1,), int8=False)
    return model


def spoiled(toy: Path, tmp: Path, change: Callable[[Path], None]) -> Path:
    """A copy of `toy` in `tmp`, changed by `change`."""
    model = tmp / "bad-model"
    shutil.copytree(toy, model)
    change(model)
    return model


def base_env(tmp: Path, toy: Path, **extra: str) -> dict[str, str]:
    """`cnclip`'s environment: a data folder and SQLite catalog in `tmp`, the model `toy`, and `extra`."""
    return {**cli_env(tmp / "data", f"sqlite:///{tmp / 'c.db'}", toy), **extra}
