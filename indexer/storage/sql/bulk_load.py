"""PostgreSQL `COPY` for the new rows of a bulk load (`ItemRows.add(..., bulk=True)`: one Parquet shard of
`cnclip index --ray`, indexer/bulk/cluster/shards.py). The items, their vectors and their tags stream
in three COPYs through the psycopg connection of the caller's transaction, instead of multi-row
INSERTs. COPY returns no ids, so they are drawn from the items' sequence first and written explicitly:
the vectors and tags name them, and the order of the rows is the order of the ids, as with INSERT.

SQLite has no COPY: its bulk load is the batch's executemany (indexer/storage/sql/row_inserts.py), in
the shard's one transaction.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from indexer.fs.file_names import to_sql

ITEM_COLUMNS = (
    "id", "collection_id", "path", "root", "sha256", "size", "mime", "width", "height", "caption", "tags",
    "extra", "mtime", "created_at", "updated_at", "version", "taken_at", "taken_source", "phash",
    "phash_version",
)  # fmt: skip
_PATH_COLUMNS = {"path", "root"}  # as models.FilePath writes them: undecodable bytes round-trip
_JSON_COLUMNS = {"tags", "extra"}


def copy_supported(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _cell(column: str, value: Any) -> Any:
    if value is None:
        return None
    if column in _PATH_COLUMNS:
        return to_sql(value)
    if column in _JSON_COLUMNS:
        return json.dumps(value)
    return value


def copy_new_rows(
    session: Session, values: list[dict[str, Any]], unit: np.ndarray, positions: list[int], model: str
) -> list[int]:
    """COPY `values` (item rows without ids), the vectors `unit[positions[i]]` and the tags of each; returns
    the new ids in the order of `values`. Runs in the session's transaction (committed by the caller)."""
    driver = session.connection().connection.driver_connection  # psycopg's, inside the session's transaction
    assert driver is not None
    with driver.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence('items', 'id')) FROM generate_series(1, %s)", (len(values),)
        )
        ids = sorted(int(row[0]) for row in cursor.fetchall())
        with cursor.copy(f"COPY items ({', '.join(ITEM_COLUMNS)}) FROM STDIN") as copy:
            for item_id, row in zip(ids, values, strict=True):
                copy.write_row([item_id, *(_cell(column, row[column]) for column in ITEM_COLUMNS[1:])])
        with cursor.copy("COPY vectors (item_id, model, vector) FROM STDIN") as copy:
            for item_id, position in zip(ids, positions, strict=True):
                copy.write_row((item_id, model, unit[position].tobytes()))
        with cursor.copy("COPY item_tags (item_id, tag) FROM STDIN") as copy:
            for item_id, row in zip(ids, values, strict=True):
                for tag in sorted(set(row["tags"])):
                    copy.write_row((item_id, tag))
    return ids
