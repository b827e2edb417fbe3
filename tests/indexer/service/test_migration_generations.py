"""Revision 0005 (model generations) on SQLite and PostgreSQL: every collection of a 0004 catalog is
generation 0 (its FAISS file keeps its name), the generation tables take rows, and a downgrade takes
them away without losing a collection or reusing ids."""

from __future__ import annotations

from sqlalchemy import inspect, text

from indexer.storage.sql.db import create_db_engine, downgrade, upgrade


def test_generations_migration_keeps_collections(database_url: str) -> None:
    engine = create_db_engine(database_url)
    upgrade(engine, "0004")
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO collections (id, name, name_key, kind, model, dim, index_factory, created_at, "
                "version, vector_key) VALUES (1, 'photos', 'photos', 'images', 'm', 4, 'Flat', '2026-01-01', 3, :key)"
            ),
            {"key": "0" * 32},
        )
        connection.execute(
            text(
                "INSERT INTO items (id, collection_id, sha256, tags, extra, created_at, updated_at, version) "
                "VALUES (1, 1, :sha, '[]', '{}', '2026-02-03', '2026-02-03', 1)"
            ),
            {"sha": "a" * 64},
        )
    assert upgrade(engine, "0005") == "0005"
    with engine.begin() as connection:
        assert connection.execute(text("SELECT generation FROM collections")).scalar() == 0
        connection.execute(
            text(
                "INSERT INTO generations (collection_id, role, number, model, dim, vector_key, created_at) "
                "VALUES (1, 'shadow', 1, 'm2', 8, :key, '2026-03-01')"
            ),
            {"key": "1" * 32},
        )
        generation = connection.execute(text("SELECT id FROM generations")).scalar()
        connection.execute(
            text("INSERT INTO generation_vectors (generation_id, item_id, model, vector) VALUES (:g, 1, 'm2', :v)"),
            {"g": generation, "v": b"\0" * 32},
        )
        connection.execute(text("DELETE FROM items WHERE id = 1"))  # the item's vectors of every generation go too
        assert connection.execute(text("SELECT count(*) FROM generation_vectors")).scalar() == 0
    assert downgrade(engine, "0004") == "0004"
    tables = set(inspect(engine).get_table_names())
    assert "generations" not in tables and "generation_vectors" not in tables
    assert "generation" not in {c["name"] for c in inspect(engine).get_columns("collections")}
    with engine.connect() as connection:
        assert connection.execute(text("SELECT name, version FROM collections")).one() == ("photos", 3)
    engine.dispose()
