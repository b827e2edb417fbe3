"""One read of a collection's row per step that needs one, and one normalisation of vectors.

An upload resolves its collection once, before the upload is read, and passes that state down: the
insert's version bump reads the active model generation's key back under the row lock (UPDATE …
RETURNING) instead of reading the row again. A search resolves once, and its vector store checks the
collection's version at most once. Counted as the SQL statements on the `collections` table itself,
on SQLite and PostgreSQL, with `sync_interval_s` 0 so that every search makes its version check (the
worst case). The item rows' join that names each hit's collection reads no collection row of its own
and is not counted.

The encoder's vectors are L2-normalised once, by the encoder (retrieval/types.py `Encoder`): the
catalog stores and searches them as they are, bit for bit, and divides only a caller's vectors of
another length (indexer/domain/vectors.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

from api.config import Settings
from indexer.domain.records import NewText
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import api_client, image_bytes
from tests.support.indexer_helpers import open_test_catalog, random_unit

ROW_STATEMENT = re.compile(r'\b(?:FROM|UPDATE|INTO)\s+"?collections"?(?:\s|$)', re.IGNORECASE)
UPLOAD = "/v1/collections/photos/items"


class CollectionStatements:
    """The SQL statements on the `collections` table an engine runs (before_cursor_execute)."""

    def __init__(self, engine: Engine) -> None:
        self.seen: list[str] = []
        event.listen(engine, "before_cursor_execute", self._statement)

    def _statement(self, _connection: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if ROW_STATEMENT.search(statement):
            self.seen.append(" ".join(statement.split()))

    def during(self, call: Callable[[], Any]) -> list[str]:
        self.seen.clear()
        response = call()
        assert response.status_code in (200, 201), response.text
        return list(self.seen)


class SlightlyLongEncoder(FakeEncoder):
    """The fake encoder's vectors, 5e-7 longer than unit length: within float32 rounding of a
    normalised vector, but divided again they change, so a second normalisation would show."""

    async def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(await super().embed_texts(texts) * np.float32(1 + 5e-7), dtype=np.float32)

    async def embed_images(self, images: Sequence[bytes]) -> np.ndarray:
        return np.asarray(await super().embed_images(images) * np.float32(1 + 5e-7), dtype=np.float32)


@pytest.fixture
def served(settings: Settings, database_url: str) -> Iterator[tuple[TestClient, Any, CollectionStatements]]:
    """A client, its catalog and a counter of its statements on the collections table."""
    worst = {"sync_interval_s": 0.0}  # every search checks the version
    catalog = open_test_catalog(settings.data_dir, database_url, model_dir=settings.model_dir, **worst)
    served = settings.model_copy(update={"database_url": database_url, **worst})
    try:
        with api_client(served, encoder=SlightlyLongEncoder(), catalog=catalog) as client:
            assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
            assert client.post("/v1/collections", json={"name": "captions", "kind": "texts"}).status_code == 201
            yield client, catalog, CollectionStatements(catalog.engine)
    finally:
        catalog.close()


def upload(client: TestClient, color: tuple[int, int, int]) -> Any:
    return client.post(UPLOAD, files={"file": (f"{color}.png", image_bytes(color), "image/png")})


def test_an_upload_reads_the_collection_row_once_and_bumps_it_once(served: Any) -> None:
    client, _catalog, statements = served
    for color in [(200, 30, 40), (60, 160, 60)]:  # the first upload, and one when the store is open
        seen = statements.during(lambda color=color: upload(client, color))
        assert len(seen) <= 2, seen
        reads = [s for s in seen if s.startswith("SELECT")]
        bumps = [s for s in seen if s.startswith("UPDATE")]
        assert len(reads) == 1 and len(bumps) == 1 and "RETURNING" in bumps[0], seen
    texts = statements.during(lambda: client.post("/v1/collections/captions/texts", json={"texts": [{"text": "猫"}]}))
    assert len(texts) <= 2, texts


def test_a_search_reads_the_collection_row_at_most_twice(served: Any) -> None:
    client, _catalog, statements = served
    upload(client, (40, 110, 220))
    searches = {
        "text, named (opens the store)": lambda: client.post(
            "/v1/search/text", json={"query": "猫", "collection": "photos"}
        ),
        "text, named": lambda: client.post("/v1/search/text", json={"query": "狗", "collection": "photos"}),
        "text, the default collection": lambda: client.post("/v1/search/text", json={"query": "海"}),
        "image, named": lambda: client.post(
            "/v1/search/image",
            files={"file": ("q.png", image_bytes((5, 5, 5)), "image/png")},
            data={"collection": "photos"},
        ),
    }
    for name, search in searches.items():
        seen = statements.during(search)
        assert 1 <= len(seen) <= 2, (name, seen)
        assert all(s.startswith("SELECT") for s in seen), (name, seen)


def test_the_encoders_vectors_are_stored_and_searched_as_they_are(served: Any, monkeypatch: Any) -> None:
    client, catalog, _statements = served
    encoder = SlightlyLongEncoder()
    data = image_bytes((230, 200, 20))
    response = client.post(UPLOAD, files={"file": ("taxi.png", data, "image/png")})
    assert response.status_code == 201, response.text
    embedded = encoder.embed_images_sync([data])[0] * np.float32(1 + 5e-7)
    again = embedded / np.linalg.norm(embedded)
    assert not np.array_equal(again, embedded)  # a second normalisation would change the stored bytes
    [stored] = catalog.rows.vectors([response.json()["id"]])
    assert np.array_equal(stored, embedded) and abs(float(np.linalg.norm(stored)) - 1.0) < 1e-5

    queries: list[np.ndarray] = []
    store = catalog.store("photos").store
    original = store.search

    def searched(query: np.ndarray, *args: Any) -> Any:
        queries.append(query)
        return original(query, *args)

    monkeypatch.setattr(store, "search", searched)
    found = client.post("/v1/search/text", json={"query": "出租车", "collection": "photos"})
    assert found.status_code == 200, found.text
    [query] = queries
    expected = encoder.embed_texts_sync(["出租车"])[0] * np.float32(1 + 5e-7)
    assert np.array_equal(query, expected) and abs(float(np.linalg.norm(query)) - 1.0) < 1e-5


def test_a_callers_vectors_of_another_length_are_stored_unit_length(tmp_path: Path, database_url: str) -> None:
    catalog = open_test_catalog(tmp_path / "data", database_url)
    try:
        catalog.create_collection("notes", "texts", "fake", 8)
        vectors = random_unit(3, 8) * np.array([[3.0], [0.5], [1.0]], dtype=np.float32)
        ids = [r.id for r in catalog.add_texts("notes", [NewText(f"note {i}") for i in range(3)], vectors)]
        np.testing.assert_allclose(np.linalg.norm(catalog.rows.vectors(ids), axis=1), 1.0, atol=1e-6)
    finally:
        catalog.close()
