"""Faults that say what they are: a database that is gone answers 503 with Retry-After (and `/readyz`
says so until it is back), a locked SQLite file likewise; never a 500."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from api.config import Settings
from api.errors import UNAVAILABLE_RETRY_AFTER_S
from tests.support.api_helpers import api_client, image_bytes, open_test_catalog
from tests.support.postgres import fresh_schema
from tests.support.tcp_proxy import TcpProxy

INTERVAL_S = 0.2  # CNCLIP_READINESS_INTERVAL_S in these tests


def upload(client: Any, color: tuple[int, int, int]) -> httpx.Response:
    return client.post(
        "/v1/collections/photos/items",
        files={"file": ("x.png", image_bytes(color), "image/png")},
        data={"caption": "一只猫"},
    )


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER_S)
    assert response.json()["error"]["code"] == "database_unavailable"


def readyz_after_interval(client: Any) -> httpx.Response:
    time.sleep(INTERVAL_S * 1.5)  # past the probe's cache
    return client.get("/readyz")


@pytest.mark.postgres
def test_postgres_going_away_answers_503_with_retry_after_and_readyz_follows_it(settings: Settings) -> None:
    with fresh_schema() as url, TcpProxy(("127.0.0.1", 5432)) as proxy:
        through_proxy = url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
        settings = settings.model_copy(update={"database_url": through_proxy, "readiness_interval_s": INTERVAL_S})
        with api_client(settings) as client:
            assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
            assert upload(client, (200, 30, 40)).status_code == 201
            assert client.get("/readyz").status_code == 200

            proxy.cut()
            assert_unavailable(client.get("/v1/collections"))
            assert_unavailable(upload(client, (20, 30, 200)))
            assert_unavailable(client.post("/v1/search/text", json={"query": "猫", "collection": "photos"}))
            down = readyz_after_interval(client)
            assert_unavailable(down)
            assert "request id" in down.json()["error"]["message"]  # the fixed 5xx text, not the driver's
            assert "5432" not in down.text and str(proxy.port) not in down.text
            media = settings.data_dir / "media"
            assert not list(media.rglob("*.tmp-*"))

            proxy.restore()
            assert readyz_after_interval(client).status_code == 200
            listed = client.get("/v1/collections")
            assert listed.status_code == 200
            assert [c["items"] for c in listed.json()] == [1]  # the upload tried while down: not in
            assert upload(client, (20, 30, 200)).status_code == 201


def test_readyz_asks_the_database_at_most_once_per_interval(settings: Settings) -> None:
    catalog = open_test_catalog(settings)
    pings: list[float] = []
    real_ping = catalog.ping

    def counted_ping() -> None:
        pings.append(time.monotonic())
        real_ping()

    catalog.ping = counted_ping  # type: ignore[method-assign]
    try:
        with api_client(settings.model_copy(update={"readiness_interval_s": 60}), catalog=catalog) as client:
            for _ in range(20):
                assert client.get("/readyz").status_code == 200
    finally:
        catalog.close()
    assert len(pings) == 1


def test_a_locked_sqlite_file_answers_writes_503_with_retry_after(settings: Settings, tmp_path: Path) -> None:
    settings = settings.model_copy(update={"readiness_interval_s": INTERVAL_S})
    catalog = open_test_catalog(settings)

    # The catalog's own busy timeout is 10 s; 0.2 s keeps the test short (the mapping is the same).
    @event.listens_for(catalog.engine, "connect")
    def short_busy_timeout(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA busy_timeout=200")

    catalog.engine.dispose()
    other = sqlite3.connect(settings.data_dir / "catalog.db", isolation_level=None)
    try:
        with api_client(settings, catalog=catalog) as client:
            assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            assert_unavailable(upload(client, (200, 30, 40)))
            assert_unavailable(client.post("/v1/collections", json={"name": "more", "kind": "texts"}))
            # Readers are not blocked (WAL): searches go on and the server stays ready.
            assert client.get("/v1/collections").status_code == 200
            assert readyz_after_interval(client).status_code == 200
            other.execute("ROLLBACK")
            assert upload(client, (200, 30, 40)).status_code == 201
    finally:
        other.close()
        catalog.close()
