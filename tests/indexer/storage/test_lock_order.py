"""The lock order of indexer/storage/sql/lock_order.py, on SQLite and PostgreSQL (issue 29, item 6).

- No thread asks the pool for a connection while it holds the media lock (the cycle was: an upload
  holds the collection row lock and waits for the media lock; a delete holds the media lock and
  waits for a pooled connection the waiting uploads hold).
- Writers can never take every pooled connection: reads still get one while every writer slot is busy.
- A pool that runs dry is `DatabaseUnavailable`, and the API answers 503 with Retry-After, not 500.
- After a commit nothing turns the answer into an error: a failed clean-up is logged and retried.
- Every function that takes a collection row lock takes a writer slot first (the source says so).
"""

from __future__ import annotations

import ast
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

import indexer.storage.media.sweep
import indexer.storage.sql.lock_order as lock_order
import indexer.storage.sql.rows
from api.config import Settings
from indexer.domain.records import NewImage
from indexer.errors import DatabaseUnavailable
from indexer.runtime import open_catalog
from indexer.storage.catalog import SqlCatalog
from indexer.storage.media.store import LOCK_NAME, media_file
from indexer.storage.sql.lock_order import writer_slot, writer_slots
from tests.support.api_helpers import api_client
from tests.support.indexer_helpers import jpeg, open_test_catalog, random_unit

DIM = 16
INDEXER = Path(__file__).resolve().parents[3] / "indexer"


@pytest.fixture
def fast_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lock_order, "POOL_TIMEOUT_S", 0.3)


@pytest.fixture
def catalog(tmp_path: Path, database_url: str, fast_timeouts: None) -> Iterator[SqlCatalog]:
    catalog = open_test_catalog(tmp_path / "data", database_url, database_pool_size=4)
    catalog.create_collection("a", "images", "m", DIM)
    catalog.create_collection("b", "images", "m", DIM)
    yield catalog
    catalog.close()


class MediaLockWatch:
    """Which threads hold the media lock now (flock on media/.lock), and every pool checkout made
    by a thread that held it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.held: dict[int, int] = {}  # thread id -> media locks held
        self.violations: list[str] = []
        real = fcntl.flock

        def flock(fd: int, operation: int) -> None:
            is_media = os.readlink(f"/proc/self/fd/{fd}").endswith(f"/media/{LOCK_NAME}")
            real(fd, operation)
            if is_media:
                me = threading.get_ident()
                delta = -1 if operation & fcntl.LOCK_UN else 1
                self.held[me] = self.held.get(me, 0) + delta

        monkeypatch.setattr(fcntl, "flock", flock)

    def checkout(self, *_: Any) -> None:
        if self.held.get(threading.get_ident(), 0) > 0:
            self.violations.append(
                f"a pooled connection was checked out under the media lock in {threading.current_thread().name}"
            )


def test_no_pooled_connection_is_waited_for_under_the_media_lock(
    catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch = MediaLockWatch(monkeypatch)
    event.listen(catalog.engine.pool, "checkout", watch.checkout)
    shared = jpeg(7)
    [first] = catalog.add_images("a", [NewImage(data=jpeg(1)), NewImage(data=shared)], random_unit(2, DIM))[:1]
    [other] = catalog.add_images("b", [NewImage(data=shared)], random_unit(1, DIM))
    ids = catalog.sql_ids("a").tolist()
    assert watch.held and not watch.violations  # the media lock was taken, and never with a checkout inside

    assert catalog.delete(ids, reason="user", remember=True) == 2  # copy of jpeg(1) goes, the shared one stays
    assert not media_file(catalog.media_dir, _sha(jpeg(1)), "image/jpeg").exists()
    assert media_file(catalog.media_dir, _sha(shared), "image/jpeg").exists()
    catalog.delete_collection("b")
    assert not media_file(catalog.media_dir, _sha(shared), "image/jpeg").exists()
    catalog.sweep_media()
    assert not watch.violations, watch.violations
    assert first.created and other.created


def test_a_delete_finishes_while_the_pool_is_empty_and_an_upload_waits_for_the_media_lock(
    catalog: SqlCatalog, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's cycle, made to happen: the delete's clean-up holds the media lock, an upload holds
    its connection and the collection row lock and waits for the media lock, and every other pooled
    connection is taken. The clean-up must finish on the connection it holds (asking the pool would
    time out), then the upload."""
    [victim] = catalog.add_images("a", [NewImage(data=jpeg(1))], random_unit(1, DIM))
    in_cleanup = threading.Event()
    release = threading.Event()
    real_lock = indexer.storage.media.sweep.media_lock

    @contextmanager
    def held_then_released(*args: Any, **kwargs: Any) -> Iterator[bool]:
        with real_lock(*args, **kwargs) as locked:
            in_cleanup.set()
            release.wait(10)
            yield locked

    monkeypatch.setattr(indexer.storage.media.sweep, "media_lock", held_then_released)
    results: dict[str, Any] = {}
    deleter = threading.Thread(
        target=lambda: results.update(d=catalog.delete([victim.id], reason="user", remember=True))
    )
    deleter.start()
    assert in_cleanup.wait(10)
    uploader = threading.Thread(
        target=lambda: results.update(u=catalog.add_images("a", [NewImage(data=jpeg(2))], random_unit(1, DIM)))
    )
    uploader.start()
    deadline = time.monotonic() + 10
    while catalog.engine.pool.checkedout() < 2 and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)
    time.sleep(0.2)  # the upload reaches the media lock
    held = [catalog.engine.connect() for _ in range(4 - 2)]  # every connection the two writers do not hold
    try:
        release.set()
        deleter.join(15)
        uploader.join(15)
    finally:
        for connection in held:
            connection.close()
    assert results.get("d") == 1 and results["u"][0].created, results
    assert catalog.sql_ids("a").tolist() == [results["u"][0].id]
    assert "could not remove" not in caplog.text  # the clean-up ran on its own connection, and did its work
    assert not media_file(catalog.media_dir, _sha(jpeg(1)), "image/jpeg").exists()


def test_writers_never_take_every_connection(catalog: SqlCatalog) -> None:
    engine = catalog.engine
    assert writer_slots(engine) == 2  # half of a pool of 4
    entered = threading.Barrier(3)
    done = threading.Event()

    def writer() -> None:
        with writer_slot(engine), engine.connect():
            entered.wait(5)
            done.wait(10)

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for thread in threads:
        thread.start()
    entered.wait(5)
    try:
        with pytest.raises(DatabaseUnavailable, match="writers"), writer_slot(engine):
            pass  # a third writer waits, then 503: nothing written
        assert catalog.rows.version_of("a") is not None  # a read still gets a connection
        assert catalog.get_collection("a").items == 0
    finally:
        done.set()
        for thread in threads:
            thread.join(10)


def test_an_exhausted_pool_is_a_503_with_retry_after(
    settings: Settings, database_url: str, fast_timeouts: None
) -> None:
    settings = settings.model_copy(update={"database_url": database_url, "database_pool_size": 2})
    catalog = open_catalog(settings)
    try:
        with api_client(settings, catalog=catalog) as client:
            held = [catalog.engine.connect() for _ in range(2)]
            try:
                response = client.get("/v1/collections")
            finally:
                for connection in held:
                    connection.close()
            assert response.status_code == 503, response.text
            assert int(response.headers["Retry-After"]) >= 1
            assert response.json()["error"]["code"] == "database_unavailable"
            assert client.get("/v1/collections").status_code == 200  # once a connection is back
    finally:
        catalog.close()


def test_a_committed_delete_answers_its_count_when_the_clean_up_fails(
    catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    [a, b] = catalog.add_images("a", [NewImage(data=jpeg(1)), NewImage(data=jpeg(2))], random_unit(2, DIM))

    def broken(*_: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(indexer.storage.sql.rows, "remove_unused_copies", broken)
    assert catalog.delete([a.id], reason="user", remember=True) == 1  # committed: the answer says so
    assert "could not remove 1 unused upload copies" in caplog.text
    assert media_file(catalog.media_dir, _sha(jpeg(1)), "image/jpeg").exists()  # left for the retry
    monkeypatch.undo()
    monkeypatch.setattr(lock_order, "POOL_TIMEOUT_S", 0.3)

    def stuck_store(*_: Any) -> None:
        raise DatabaseUnavailable("the store could not catch up")

    monkeypatch.setattr(catalog.stores, "after_write", stuck_store)
    assert catalog.delete([b.id], reason="user", remember=True) == 1  # nor does the store's catch-up
    assert catalog.sql_ids("a").tolist() == []
    for data in (jpeg(1), jpeg(2)):  # the next clean-up retried the one the failed one left
        assert not media_file(catalog.media_dir, _sha(data), "image/jpeg").exists()


def test_every_row_lock_is_taken_after_a_writer_slot() -> None:
    """Each function of indexer/ that bumps a collection's version (the row lock) takes a writer slot
    first, or is a helper whose callers (in any module) all do; and nothing hands the copy
    clean-up a callback that asks the pool for a connection of its own."""
    functions: dict[tuple[str, str], str] = {}
    for path in sorted(INDEXER.rglob("*.py")):  # every package of indexer/
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions[(str(path.relative_to(INDEXER)), node.name)] = ast.unparse(node)
    offenders: list[str] = []
    for (module, name), source in functions.items():
        bumps = "bump_version(" in source or "bump_collection(" in source
        if name not in ("bump_version", "bump_collection") and bumps and "writer_slot(" not in source:
            # A helper that takes the lock for its callers: every caller (in any module) holds a slot.
            callers = [c for key, c in functions.items() if key != (module, name) and f"{name}(" in c]
            if not callers or any("writer_slot(" not in c for c in callers):
                offenders.append(f"{module}:{name} takes a row lock without a writer slot")
        if "remove_unused_copies(" in source and ".uploads_in_use)" in source:
            offenders.append(f"{module}:{name} asks the pool for a connection under the media lock")
    assert not offenders, offenders


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
