"""Alembic migrations: they build exactly the models' schema, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from typer.testing import CliRunner

from cli.main import build_cli
from indexer.storage.sql.db import create_db_engine, current_revision, downgrade, head_revision, upgrade
from indexer.storage.sql.models import Base


def test_models_and_migrations_agree(database_url: str) -> None:
    engine = create_db_engine(database_url)
    assert upgrade(engine) == head_revision()
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    engine.dispose()


def test_downgrade_and_upgrade_again(database_url: str) -> None:
    engine = create_db_engine(database_url)
    upgrade(engine)
    assert downgrade(engine, "base") is None
    assert not {"collections", "items", "vectors", "item_tags"} & set(inspect(engine).get_table_names())
    assert upgrade(engine) == head_revision()
    engine.dispose()


def test_db_upgrade_command(database_url: str, tmp_path) -> None:
    env = {"CNCLIP_DATABASE_URL": database_url, "CNCLIP_DATA_DIR": str(tmp_path / "data")}
    result = CliRunner().invoke(build_cli(), ["db", "upgrade"], env=env)
    assert result.exit_code == 0, result.output
    assert f"schema revision {head_revision()}" in result.output
    engine = create_db_engine(database_url)
    assert current_revision(engine) == head_revision()
    assert {"collections", "items", "vectors", "item_tags"} <= set(inspect(engine).get_table_names())
    engine.dispose()
    again = CliRunner().invoke(build_cli(), ["db", "upgrade"], env=env)  # idempotent
    assert again.exit_code == 0, again.output


def test_unreachable_database_is_a_clear_error(tmp_path) -> None:
    env = {"CNCLIP_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/none", "CNCLIP_DATA_DIR": str(tmp_path)}
    result = CliRunner().invoke(build_cli(), ["db", "upgrade"], env=env)
    assert result.exit_code == 1
    assert "cannot reach the database" in result.output and "Traceback" not in result.output


def test_storage_v2_migration_keeps_every_row_and_separates_names_that_differ_in_case(database_url: str) -> None:
    """A 0001 catalog with items, vectors and tags, and two collections named `demo` and `DEMO`:
    after 0002 every row is still there, ids are kept, and the younger `DEMO` is renamed."""
    engine = create_db_engine(database_url)
    upgrade(engine, "0001")
    with engine.begin() as connection:
        for cid, name in [(1, "demo"), (2, "DEMO")]:
            connection.execute(
                text(
                    "INSERT INTO collections (id, name, kind, model, dim, index_factory, created_at) "
                    "VALUES (:id, :name, 'images', 'm', 4, 'Flat', '2026-01-01')"
                ),
                {"id": cid, "name": name},
            )
        for item in range(1, 4):
            connection.execute(
                text(
                    "INSERT INTO items (id, collection_id, sha256, tags, extra, created_at, updated_at) "
                    "VALUES (:id, 1, :sha, '[]', '{}', '2026-01-01', '2026-01-01')"
                ),
                {"id": item, "sha": f"{item:064d}"},
            )
            connection.execute(
                text("INSERT INTO vectors (item_id, model, vector) VALUES (:id, 'm', :v)"),
                {"id": item, "v": b"\0" * 16},
            )
            connection.execute(text("INSERT INTO item_tags (item_id, tag) VALUES (:id, 'x')"), {"id": item})
    assert upgrade(engine) == head_revision()
    with engine.connect() as connection:
        names = connection.execute(text("SELECT id, name, name_key, version FROM collections ORDER BY id")).all()
        assert [tuple(row) for row in names] == [(1, "demo", "demo", 0), (2, "DEMO-2", "demo-2", 0)]
        assert connection.execute(text("SELECT count(*) FROM items WHERE version = 0")).scalar() == 3
        assert connection.execute(text("SELECT count(*) FROM vectors")).scalar() == 3  # nothing cascaded away
        assert connection.execute(text("SELECT count(*) FROM item_tags")).scalar() == 3
        keys = connection.execute(text("SELECT vector_key FROM collections")).scalars().all()
        assert len(set(keys)) == 2 and all(len(k) == 32 for k in keys)
    engine.dispose()


def test_taken_at_migration_keeps_rows_ids_and_autoincrement_and_dates_uploads(database_url: str) -> None:
    """A 0002 catalog with a folder file, an upload, a text and a deleted top id: after 0003 every row
    and vector is there, the upload's taken_at is its upload time (source `upload`), the file's is
    NULL until `cnclip index` reads it, texts have none, and a new item never reuses a deleted id."""
    engine = create_db_engine(database_url)
    upgrade(engine, "0002")
    with engine.begin() as connection:
        for cid, name, kind in [(1, "photos", "images"), (2, "words", "texts")]:
            connection.execute(
                text(
                    "INSERT INTO collections (id, name, name_key, kind, model, dim, index_factory, created_at, "
                    "version, vector_key) VALUES (:id, :name, :name, :kind, 'm', 4, 'Flat', '2026-01-01', 0, :key)"
                ),
                {"id": cid, "name": name, "kind": kind, "key": f"{cid:032d}"},
            )
        rows = [(1, 1, "/photos/a.jpg"), (2, 1, None), (3, 2, None), (4, 1, "/photos/gone.jpg")]
        for item, cid, path in rows:
            connection.execute(
                text(
                    "INSERT INTO items (id, collection_id, path, sha256, tags, extra, created_at, updated_at, version) "
                    "VALUES (:id, :cid, :path, :sha, '[]', '{}', '2026-02-03 04:05:06', '2026-02-03 04:05:06', 1)"
                ),
                {"id": item, "cid": cid, "path": path, "sha": f"{item:064d}"},
            )
            connection.execute(
                text("INSERT INTO vectors (item_id, model, vector) VALUES (:id, 'm', :v)"),
                {"id": item, "v": b"\0" * 16},
            )
        if engine.dialect.name == "postgresql":  # explicit ids leave the sequence behind; a real catalog's is not
            connection.execute(text("SELECT setval(pg_get_serial_sequence('items', 'id'), 4)"))
        connection.execute(text("DELETE FROM items WHERE id = 4"))  # the highest id, deleted
    assert upgrade(engine, "0003") == "0003"
    with engine.begin() as connection:
        got = connection.execute(text("SELECT id, taken_at, taken_source FROM items ORDER BY id")).all()
        assert [(i, str(t) if t else None, s) for i, t, s in got] == [
            (1, None, None),
            (2, "2026-02-03 04:05:06", "upload"),
            (3, None, None),
        ]
        assert connection.execute(text("SELECT count(*) FROM vectors")).scalar() == 3  # nothing cascaded away
        connection.execute(
            text(
                "INSERT INTO items (collection_id, sha256, tags, extra, created_at, updated_at, version) "
                "VALUES (1, :sha, '[]', '{}', '2026-03-01', '2026-03-01', 2)"
            ),
            {"sha": "f" * 64},
        )
        new_id = connection.execute(text("SELECT max(id) FROM items")).scalar()
    assert new_id == 5  # 4 was deleted: AUTOINCREMENT (SQLite) / the sequence (PostgreSQL) never reuses it
    assert downgrade(engine, "0002") == "0002"
    assert "taken_at" not in {c["name"] for c in inspect(engine).get_columns("items")}
    engine.dispose()
