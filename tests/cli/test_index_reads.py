"""`cnclip index` resolves its collection once (`ensure`, before the model loads, the state passed to
the pipeline) and reads the folder's file states once per run, plus once more for `--prune`, which
must see the rows as the run's moves and replacements left them; the date and hash backfills use the
states the plan read. Counted with spies on the real service and catalog, in-process."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from cli.main import build_cli
from indexer.service.collections import CollectionService
from indexer.storage.catalog import SqlCatalog
from tests.support.indexer_helpers import cli_env, write_images


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often the real `ensure` and `file_states` were called."""
    counted: Counter[str] = Counter()
    for owner, name in [(CollectionService, "ensure"), (SqlCatalog, "file_states")]:
        real = getattr(owner, name)

        def spy(self: Any, *args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            counted[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(owner, name, spy)
    return counted


def test_an_index_run_ensures_once_and_reads_file_states_once(
    tmp_path: Path, toy_model_dir: Path, calls: Counter[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    env, engine = cli_env(tmp_path / "data", url, toy_model_dir), create_engine(url)
    folder = tmp_path / "photos"
    images = write_images(folder, 6)

    def index(*options: str) -> None:
        calls.clear()
        result = CliRunner().invoke(build_cli(), ["index", str(folder), "--collection", "photos", *options], env=env)
        assert result.exit_code == 0, result.output

    index()  # a new collection
    assert calls == {"ensure": 1, "file_states": 1}
    images[0].rename(folder / "renamed.jpg")  # a move, found by content
    images[1].unlink()  # gone: pruned
    index("--prune")
    assert calls == {"ensure": 1, "file_states": 2}  # the prune reads the rows the run left
    index()  # nothing changed
    assert calls == {"ensure": 1, "file_states": 1}
    with engine.begin() as connection:  # rows as an older version left them: no date, no perceptual hash
        connection.execute(text("UPDATE items SET taken_at = NULL, taken_source = NULL, phash = NULL"))
    index()  # both backfills, from the states the plan read
    assert calls == {"ensure": 1, "file_states": 1}
    with engine.connect() as connection:
        undone = "SELECT count(*) FROM items WHERE taken_at IS NULL OR phash IS NULL"
        assert connection.execute(text(undone)).scalar() == 0
    engine.dispose()
