"""The one order in which a process takes its locks, and the connection pool they share.

Every write takes, in this order, and releases in the reverse one:

  1. a writer slot (`writer_slot`): at most `writer_slots(engine)` threads of a process write at
     once, half the pool, so that writers queued behind one collection's row lock can never hold
     every pooled connection: reads (searches, item reads, readiness) always find one;
  2. one pooled connection, checked out once: everything below runs on it, and nothing waits for a
     second pooled connection while it holds a lock (a pool that ran dry under a lock was the cycle);
  3. the collection row lock(s): the version bump (`indexer.storage.sql.deletion_rows.bump_version`), by ascending
     collection id when one transaction writes several collections;
  4. the media lock (flock on data_dir/media/.lock, indexer/storage/media/store.py): taken shared by an upload
     from writing its copy until its row commits, exclusively by whoever removes copies (a delete's
     clean-up after its commit, the start-up sweep). Its exclusive holder waits on nothing else: it
     holds its connection already and takes no row lock (its SELECTs wait for none), so an upload
     that holds a row lock and waits for the media lock always gets it.

Reads take only 2. A wait that lasts longer than the pool's timeout (a writer slot, a connection)
is `DatabaseUnavailable` (503 with Retry-After) before anything was written, never a 500.

The pool: `database_pool_size` connections per process (docs/scaling-out.md says how to size it
against PostgreSQL's `max_connections` for N replicas), no overflow, so the bound is exact.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool

from indexer.errors import DatabaseUnavailable

DEFAULT_POOL_SIZE = 10  # connections per process; see docs/scaling-out.md#database-connections
POOL_TIMEOUT_S = 10.0  # longest wait for a pooled connection or a writer slot, then 503

_slots: weakref.WeakKeyDictionary[Engine, threading.BoundedSemaphore] = weakref.WeakKeyDictionary()
_slots_lock = threading.Lock()


class BusyPool(QueuePool):
    """A QueuePool whose exhaustion is `DatabaseUnavailable` (the API's 503 with Retry-After)."""

    def _do_get(self) -> ConnectionPoolEntry:
        try:
            return super()._do_get()
        except PoolTimeout as exc:
            raise DatabaseUnavailable(
                f"all {self.size()} database connections of this process stayed busy for {self._timeout:g} s; "
                "retry in a moment (CNCLIP_DATABASE_POOL_SIZE sizes the pool)"
            ) from exc


def pool_options(url: str, pool_size: int | None) -> dict[str, Any]:
    """`create_engine` arguments for `url`'s pool: `pool_size` connections (default
    `DEFAULT_POOL_SIZE`), no overflow, `BusyPool`. In-memory SQLite keeps SQLAlchemy's own pool."""
    if url.startswith("sqlite"):
        path = url.split(":///", 1)[1] if ":///" in url else ""
        if path in ("", ":memory:") or path.startswith("file:"):
            return {}
    return {
        "poolclass": BusyPool,
        "pool_size": pool_size or DEFAULT_POOL_SIZE,
        "max_overflow": 0,
        "pool_timeout": POOL_TIMEOUT_S,
    }


def writer_slots(engine: Engine) -> int:
    """How many threads of this process may write through `engine` at once: half its pool (at least
    one), so that as many connections stay for reads."""
    size = getattr(engine.pool, "size", None)
    return max(1, int(size()) // 2) if callable(size) else 1_000_000


def _semaphore(engine: Engine) -> threading.BoundedSemaphore:
    with _slots_lock:
        semaphore = _slots.get(engine)
        if semaphore is None:
            semaphore = _slots[engine] = threading.BoundedSemaphore(writer_slots(engine))
        return semaphore


@contextmanager
def writer_slot(engine: Engine) -> Iterator[None]:
    """Step 1 of the order: hold one of the engine's writer slots (take it before the connection).
    `DatabaseUnavailable` after `POOL_TIMEOUT_S` without one: nothing was written."""
    semaphore = _semaphore(engine)
    if not semaphore.acquire(timeout=POOL_TIMEOUT_S):
        raise DatabaseUnavailable(
            f"the {writer_slots(engine)} writers this process allows stayed busy for {POOL_TIMEOUT_S:g} s; "
            "retry in a moment"
        )
    try:
        yield
    finally:
        semaphore.release()
