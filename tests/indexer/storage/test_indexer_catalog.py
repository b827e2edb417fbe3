"""The catalog on SQLite and PostgreSQL: adds, dedupe, reads, deletes, filters, errors, concurrency."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from indexer.domain.records import NewImage, NewText, SearchFilters
from indexer.storage.catalog import SqlCatalog
from retrieval.errors import Conflict, InvalidImage, InvalidInput, NotFound
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import jpeg, png, random_unit

DIM = 16


def add_photos(catalog: SqlCatalog, count: int, start: int = 0, name: str = "photos", **kwargs: object) -> list[int]:
    images = [
        NewImage(data=png(i) if i % 4 == 3 else jpeg(i), tags=["even"] if i % 2 == 0 else ["odd", f"n{i}"])
        for i in range(start, start + count)
    ]
    vectors = FakeEncoder(DIM).embed_images_sync([image.data for image in images])
    return [r.id for r in catalog.add_images(name, images, vectors, **kwargs)]


def test_add_get_dedupe_and_delete(catalog: SqlCatalog) -> None:
    catalog.create_collection("photos", "images", "fake", DIM)
    ids = add_photos(catalog, 6)
    assert ids == sorted(ids) and len(set(ids)) == 6

    # Same bytes again (and twice in one call): no new rows, the existing ids come back.
    data = jpeg(0)
    again = catalog.add_images(
        "photos", [NewImage(data=data), NewImage(data=data)], FakeEncoder(DIM).embed_images_sync([data, data])
    )
    assert [(r.id, r.created) for r in again] == [(ids[0], False), (ids[0], False)]

    record = catalog.get(ids[1])
    assert (record.collection, record.kind, record.mime, record.width, record.height) == (
        "photos",
        "images",
        "image/jpeg",
        24,
        16,
    )
    assert record.tags == ["odd", "n1"] and record.created_at is not None and record.created_at.tzinfo is not None
    assert catalog.get(ids[3]).mime == "image/png"
    assert [r.id for r in catalog.get_many([ids[2], 10**9, ids[0]])] == [ids[2], ids[0]]

    # Uploads are copied under data_dir/media by content; the stored vector is the one given.
    assert catalog.read_media(catalog.get(ids[1])) == jpeg(1)
    np.testing.assert_allclose(catalog.vector(ids[1]), FakeEncoder(DIM).embed_images_sync([jpeg(1)])[0], atol=1e-6)

    assert catalog.delete([ids[1], 10**9], reason="user", remember=True) == 1
    with pytest.raises(NotFound):
        catalog.get(ids[1])
    with pytest.raises(NotFound):
        catalog.vector(ids[1])
    assert not any(catalog.media_dir.rglob(f"*{record.sha256}*"))
    info = catalog.get_collection("photos")
    assert (info.items, info.vectors) == (5, 5)
    assert list(catalog.index_ids("photos")) == list(catalog.sql_ids("photos"))


def test_ids_are_never_reused(catalog: SqlCatalog) -> None:
    catalog.create_collection("photos", "images", "fake", DIM)
    ids = add_photos(catalog, 3)
    catalog.delete([ids[-1]], reason="user", remember=True)
    (new,) = add_photos(catalog, 1, start=10)
    assert new > ids[-1]  # a stale FAISS id can never name a new row


def test_delete_collection_removes_its_items_and_index_only(catalog: SqlCatalog) -> None:
    catalog.create_collection("photos", "images", "old-model", DIM)
    catalog.create_collection("kept", "images", "fake", DIM)
    ids = add_photos(catalog, 4)
    kept = add_photos(catalog, 2, start=20, name="kept")
    catalog.flush()
    index_files = set(catalog.vectors.index_dir.glob("*.faiss"))
    assert catalog.delete_collection("photos") == 4
    assert len(set(catalog.vectors.index_dir.glob("*.faiss"))) == len(index_files) - 1
    assert catalog.get_many(ids) == [] and [r.id for r in catalog.get_many(kept)] == kept
    with pytest.raises(NotFound):
        catalog.get_collection("photos")
    with pytest.raises(NotFound):
        catalog.delete_collection("photos")
    # The name is free again, for another model; its searches see none of the old vectors.
    catalog.create_collection("photos", "images", "new-model", DIM)
    assert catalog.get_collection("photos").items == 0
    assert catalog.search("photos", random_unit(1, DIM)[0], 5) == []
    assert len(catalog.search("kept", random_unit(1, DIM)[0], 5)) == 2


def test_texts_collection(catalog: SqlCatalog) -> None:
    catalog.create_collection("captions", "texts", "fake", DIM)
    texts = [NewText("一只猫", tags=["animal"]), NewText("一辆汽车"), NewText("一只猫")]
    vectors = FakeEncoder(DIM).embed_texts_sync([t.text for t in texts])
    results = catalog.add_texts("captions", texts, vectors)
    assert [r.created for r in results] == [True, True, False] and results[2].id == results[0].id
    record = catalog.get(results[0].id)
    assert (record.kind, record.caption, record.tags) == ("texts", "一只猫", ["animal"])
    hits = catalog.search("captions", vectors[1], k=2)
    assert hits[0].id == results[1].id and hits[0].score == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(NotFound):
        catalog.read_media(catalog.get(results[0].id))


def test_collections_and_errors(catalog: SqlCatalog) -> None:
    first = catalog.create_collection("photos", "images", "fake", DIM)
    catalog.create_collection("captions", "texts", "fake", DIM)
    catalog.create_collection("more", "images", "fake", DIM)
    assert [c.name for c in catalog.list_collections()] == ["photos", "captions", "more"]
    assert [c.id for c in catalog.collections()][0] == first.id  # oldest first: the service's default
    with pytest.raises(Conflict):
        catalog.create_collection("photos", "images", "fake", DIM)
    with pytest.raises(InvalidInput):
        catalog.create_collection("bad name!", "images", "fake", DIM)
    with pytest.raises(InvalidInput, match=r"unsupported index 'NotAnIndex': use Flat, HNSW\{M\}"):
        catalog.create_collection("weird", "images", "fake", DIM, index="NotAnIndex")
    with pytest.raises(NotFound):
        catalog.get_collection("nope")
    with pytest.raises(NotFound):
        catalog.search("nope", np.ones(DIM), 3)
    data = [NewImage(data=jpeg(1))]
    with pytest.raises(InvalidInput, match="shape"):
        catalog.add_images("photos", data, np.ones((1, DIM + 1)))
    with pytest.raises(InvalidImage):
        catalog.add_images("photos", [NewImage(data=b"not an image")], random_unit(1, DIM))
    with pytest.raises(InvalidInput):
        catalog.search("photos", np.ones(DIM + 2), 3)
    assert catalog.get_collection("photos").items == 0  # nothing half-written by the failures


def test_filters_are_exact(catalog: SqlCatalog) -> None:
    catalog.create_collection("photos", "images", "fake", DIM)
    ids = add_photos(catalog, 40)
    vectors = np.stack([catalog.vector(i) for i in ids])
    records = {r.id: r for r in catalog.get_many(ids)}
    query = random_unit(1, DIM, seed=7)[0]
    now = datetime.now(UTC)

    def expected(keep: list[int], k: int) -> list[int]:
        order = np.argsort(-(vectors @ query), kind="stable")
        return [ids[i] for i in order if ids[i] in keep][:k]

    cases = [
        (SearchFilters(tags=["odd"]), [i for i in ids if "odd" in records[i].tags]),
        (SearchFilters(tags=["odd", "n5"]), [i for i in ids if "n5" in records[i].tags]),
        (SearchFilters(tags=["odd", "even"]), []),
        (SearchFilters(mime=["image/png"]), [i for i in ids if records[i].mime == "image/png"]),
        (SearchFilters(date_from=now - timedelta(hours=1), date_to=now + timedelta(hours=1)), ids),
        (SearchFilters(date_from=now + timedelta(hours=1)), []),
        (
            SearchFilters(tags=["even"], mime=["image/jpeg"]),
            [i for i in ids if "even" in records[i].tags and records[i].mime == "image/jpeg"],
        ),
    ]
    for filters, keep in cases:
        hits = catalog.search("photos", query, k=5, filters=filters)
        assert [h.id for h in hits] == expected(keep, 5), filters
    unfiltered = catalog.search("photos", query, k=40)
    assert [h.id for h in unfiltered] == expected(ids, 40)
    assert all(a.score >= b.score for a, b in zip(unfiltered, unfiltered[1:], strict=False))


def test_searches_run_during_writes(catalog: SqlCatalog) -> None:
    catalog.create_collection("photos", "images", "fake", DIM)
    add_photos(catalog, 10)
    errors: list[BaseException] = []
    done = threading.Event()

    def search_loop() -> None:
        query = random_unit(1, DIM, seed=3)[0]
        while not done.is_set():
            try:
                hits = catalog.search("photos", query, k=5)
                assert len(hits) == 5
            except BaseException as exc:  # collected and re-raised by the test thread
                errors.append(exc)
                return

    readers = [threading.Thread(target=search_loop) for _ in range(3)]
    for reader in readers:
        reader.start()
    for batch in range(6):
        add_photos(catalog, 5, start=100 + batch * 5)
    catalog.delete(list(catalog.sql_ids("photos")[:5]), reason="user", remember=True)
    done.set()
    for reader in readers:
        reader.join()
    assert not errors
    assert list(catalog.index_ids("photos")) == list(catalog.sql_ids("photos"))
    assert catalog.get_collection("photos").items == 35
