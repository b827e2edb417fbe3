"""Issue 21, finding 9: a file at CNCLIP_DATABASE_URL that is not a cnclip catalog (zero-length, not
SQLite, another application's tables, an unknown schema revision) is refused in one line, and left
as it was; it never silently becomes an empty catalog. A missing file still starts a new one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import build_cli
from indexer.storage.sql.db import DatabaseRefused, check_database, head_revision
from tests.support.indexer_helpers import open_test_catalog


def _foreign_tables(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        connection.execute("INSERT INTO notes (body) VALUES ('keep me')")
    connection.close()


def _unknown_revision(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        connection.execute("INSERT INTO alembic_version VALUES ('9f3c0ffee')")
    connection.close()


FILES = {
    "empty": (lambda path: path.write_bytes(b""), "is empty (0 bytes)"),
    "not-sqlite": (lambda path: path.write_text("id,name\n1,a\n"), "is not a SQLite database"),
    "foreign-tables": (_foreign_tables, "holds another application's tables (notes)"),
    "unknown-revision": (_unknown_revision, "has schema revision '9f3c0ffee'"),
}


@pytest.mark.parametrize("kind", list(FILES))
def test_a_file_that_is_not_a_catalog_is_refused_in_one_line_and_kept(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    make, message = FILES[kind]
    make(path)
    before = path.read_bytes()
    env = {"CNCLIP_DATABASE_URL": f"sqlite:///{path}", "CNCLIP_DATA_DIR": str(tmp_path / "data")}
    result = CliRunner().invoke(build_cli(), ["db", "upgrade"], env=env)
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    with pytest.raises(DatabaseRefused, match="not a cnclip catalog|SQLite|another application|revision"):
        open_test_catalog(tmp_path / "data", f"sqlite:///{path}")  # what `cnclip serve` and `index` open
    assert path.read_bytes() == before  # nothing created in it


def test_serve_refuses_an_empty_database_file_in_one_line(
    monkeypatch: pytest.MonkeyPatch, toy_model_dir: Path, tmp_path: Path
) -> None:
    import faiss

    monkeypatch.setattr(faiss, "omp_set_num_threads", lambda n: None)  # keep this process's FAISS as it was
    started: list[object] = []
    monkeypatch.setattr("cli.serving.run_server", lambda app, *args, **kwargs: started.append(app))
    path = tmp_path / "catalog.db"
    path.write_bytes(b"")
    monkeypatch.setenv("CNCLIP_MODEL_DIR", str(toy_model_dir))
    monkeypatch.setenv("CNCLIP_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CNCLIP_DATABASE_URL", f"sqlite:///{path}")
    result = CliRunner().invoke(build_cli(), ["serve"])
    assert result.exit_code == 1 and "is empty (0 bytes)" in result.output and "Traceback" not in result.output
    assert not started


def test_a_missing_file_or_a_catalog_is_accepted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new' / 'catalog.db'}"
    check_database(url)  # missing: a new catalog
    catalog = open_test_catalog(tmp_path / "data", url)
    catalog.close()
    check_database(url)  # a catalog at the newest revision
    with sqlite3.connect(tmp_path / "new" / "catalog.db") as connection:
        assert connection.execute("SELECT version_num FROM alembic_version").fetchone()[0] == head_revision()
    connection.close()
