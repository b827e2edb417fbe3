"""`SqlCatalog.load_images`, the bulk load of a `cnclip index --ray` shard (PostgreSQL COPY,
indexer/storage/sql/bulk_load.py; SQLite the batch's executemany): the rows, vectors and tags it
writes equal `add_images`' for the same images, known bytes are not added again, a replaced row goes,
and the vector engine catches up from SQL as after any write. On both databases."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pytest
from sqlalchemy import text

import indexer.storage.sql.row_inserts as row_inserts
from indexer.domain.records import NewImage
from indexer.storage.catalog import SqlCatalog
from tests.support.indexer_helpers import jpeg, random_unit

DIM = 512


def file_image(index: int, folder: str) -> NewImage:
    """A bulk-indexed file as a shard carries it: its facts, no bytes (`size` says how many)."""
    data = jpeg(index)
    return NewImage(
        data=b"",
        path=f"/{folder}/{index:03d}.jpg",
        root=f"/{folder}",
        caption=None,
        tags=["shard", f"t{index % 3}"],
        extra={"n": index},
        mtime=1_700_000_000.5 + index,
        mime="image/jpeg",
        width=16,
        height=16,
        sha256=hashlib.sha256(data).hexdigest(),
        taken_at=datetime(2024, 5, 1, 12, index % 60, tzinfo=UTC),
        taken_source="mtime",
        phash=-(2**62) + index,
        size=len(data),
    )


def stored(catalog: SqlCatalog, collection: str) -> list[tuple[object, ...]]:
    """Every row of `collection` as the columns it was given, with its vector and tags, by path."""
    query = text(
        "SELECT i.path, i.root, i.sha256, i.size, i.mime, i.width, i.height, i.mtime, i.taken_at, i.taken_source, "
        "i.phash, i.extra, v.vector, (SELECT count(*) FROM item_tags t WHERE t.item_id = i.id) "
        "FROM items i JOIN vectors v ON v.item_id = i.id JOIN collections c ON c.id = i.collection_id "
        "WHERE c.name = :name ORDER BY i.path"
    )
    with catalog.engine.connect() as connection:
        rows = [tuple(row) for row in connection.execute(query, {"name": collection})]
    return [(str(row[0]).replace("/bulk/", "/x/").replace("/batch/", "/x/"), *row[1:]) for row in rows]


def test_a_bulk_load_writes_what_add_images_writes(catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch) -> None:
    copies: list[int] = []  # the loads that went through COPY (PostgreSQL's), and their rows

    def counted(session: object, values: list[dict[str, object]], *args: object) -> list[int]:
        copies.append(len(values))
        return original(session, values, *args)  # type: ignore[arg-type]

    original = row_inserts.copy_new_rows
    monkeypatch.setattr(row_inserts, "copy_new_rows", counted)
    for name in ("bulk", "batch"):
        catalog.create_collection(name, "images", "m", DIM)
    vectors = random_unit(40, DIM, seed=3)
    bulk = catalog.collection("bulk")
    results = catalog.load_images(bulk, [file_image(i, "bulk") for i in range(40)], vectors)
    catalog.add_images("batch", [file_image(i, "batch") for i in range(40)], vectors)

    assert [r.created for r in results] == [True] * 40 and len({r.id for r in results}) == 40
    loaded, added = stored(catalog, "bulk"), stored(catalog, "batch")
    roots = {row[1] for row in loaded} | {row[1] for row in added}
    assert len(loaded) == 40 and roots == {"/bulk", "/batch"}
    assert [row[2:] for row in loaded] == [row[2:] for row in added]  # every column, vector and tag count
    assert catalog.get(results[7].id).tags == ["shard", "t1"]

    again = catalog.load_images(catalog.collection("bulk"), [file_image(i, "bulk") for i in range(40)], vectors)
    assert [(r.id, r.created) for r in again] == [(r.id, False) for r in results]  # known bytes: not twice

    changed = replace(file_image(99, "bulk"), path="/bulk/000.jpg")
    [swapped] = catalog.load_images(catalog.collection("bulk"), [changed], vectors[:1], replace=[results[0].id])
    assert swapped.created and len(stored(catalog, "bulk")) == 40  # the replaced row went in the same load
    assert catalog.vector_count("bulk") == 40  # the engine caught up from SQL
    assert copies == ([40, 1] if catalog.engine.dialect.name == "postgresql" else [])
    hits = catalog.search("bulk", vectors[5], 1)
    assert hits[0].id == results[5].id and np.isclose(hits[0].score, 1.0, atol=1e-5)
