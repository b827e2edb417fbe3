"""Revision 0004 (near-duplicate groups) on SQLite and PostgreSQL: every row and id of a 0003 catalog is
kept, images get no perceptual hash until `cnclip index` reads them, copies have their table, and a
downgrade takes both away without reusing ids."""

from __future__ import annotations

from sqlalchemy import inspect, text

from indexer.storage.sql.db import create_db_engine, downgrade, upgrade


def test_duplicates_migration_keeps_rows_and_ids(database_url: str) -> None:
    engine = create_db_engine(database_url)
    upgrade(engine, "0003")
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO collections (id, name, name_key, kind, model, dim, index_factory, created_at, "
                "version, vector_key) VALUES (1, 'photos', 'photos', 'images', 'm', 4, 'Flat', '2026-01-01', 3, :key)"
            ),
            {"key": "0" * 32},
        )
        for item, path in [(1, "/p/a.jpg"), (2, None), (3, "/p/gone.jpg")]:
            connection.execute(
                text(
                    "INSERT INTO items (id, collection_id, path, sha256, tags, extra, created_at, updated_at, version) "
                    "VALUES (:id, 1, :path, :sha, '[]', '{}', '2026-02-03', '2026-02-03', 1)"
                ),
                {"id": item, "path": path, "sha": f"{item:064d}"},
            )
            connection.execute(
                text("INSERT INTO vectors (item_id, model, vector) VALUES (:id, 'm', :v)"),
                {"id": item, "v": b"\0" * 16},
            )
        if engine.dialect.name == "postgresql":
            connection.execute(text("SELECT setval(pg_get_serial_sequence('items', 'id'), 3)"))
        connection.execute(text("DELETE FROM items WHERE id = 3"))
    assert upgrade(engine, "0004") == "0004"
    with engine.begin() as connection:
        rows = connection.execute(text("SELECT id, phash FROM items ORDER BY id")).all()
        assert [tuple(r) for r in rows] == [(1, None), (2, None)]
        assert connection.execute(text("SELECT count(*) FROM vectors")).scalar() == 2
        connection.execute(
            text(
                "INSERT INTO item_copies (collection_id, sha256, path, size, mtime, recorded_at) "
                "VALUES (1, :sha, '/p/b.jpg', 10, 1.5, '2026-03-01')"
            ),
            {"sha": f"{1:064d}"},
        )
        connection.execute(
            text(
                "INSERT INTO items (collection_id, sha256, tags, extra, created_at, updated_at, version, phash) "
                "VALUES (1, :sha, '[]', '{}', '2026-03-01', '2026-03-01', 2, :h)"
            ),
            {"sha": "f" * 64, "h": -(2**63)},
        )
        assert connection.execute(text("SELECT max(id) FROM items")).scalar() == 4  # 3 was deleted: never reused
        assert connection.execute(text("SELECT phash FROM items WHERE id = 4")).scalar() == -(2**63)
    assert downgrade(engine, "0003") == "0003"
    assert "phash" not in {c["name"] for c in inspect(engine).get_columns("items")}
    assert "item_copies" not in inspect(engine).get_table_names()
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM items WHERE id = 4"))
        connection.execute(
            text(
                "INSERT INTO items (collection_id, sha256, tags, extra, created_at, updated_at, version) "
                "VALUES (1, :sha, '[]', '{}', '2026-03-01', '2026-03-01', 2)"
            ),
            {"sha": "e" * 64},
        )
        assert connection.execute(text("SELECT max(id) FROM items")).scalar() == 5  # still never reused
    engine.dispose()
