"""Alembic migrations: they build exactly the models' schema, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from typer.testing import CliRunner

from api.cli import build_cli
from indexer.db import alembic_config, create_db_engine, current_revision, head_revision, upgrade
from indexer.models import Base


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
    config = alembic_config(database_url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "base")
    assert current_revision(engine) is None
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
