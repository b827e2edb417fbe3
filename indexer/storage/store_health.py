"""Which collections' vector stores are degraded, and when to try them again.

One collection's store can fail where the others do not: its index files cannot be opened or locked
(a folder where its lock file belongs), FAISS fails inside native code on it, a Milvus collection is
damaged. (A damaged or foreign file at the index's own name is not a failure: it is rebuilt from SQL.)
Such a failure must not stop the process (a server serves its other collections) nor hide: the
collection is recorded here as degraded, its searches answer `CollectionUnavailable` (503, naming the
collection) without touching the engine until its back-off expires, then the store is opened again
from SQL (indexer/storage/store_pool.py). Its SQL rows are untouched: writes still commit, and the store
catches up with them once it opens. `GET /v1/collections/{name}` and `/metrics` say which collections
are degraded (docs/api.md).

What is not the collection's fault is not recorded: the database being away (`DatabaseUnavailable`),
another process holding the engine's storage (`VectorStoreBusy`), the engine refusing one request for
good (`VectorStoreIncompatible`, e.g. a filter its version cannot parse: 501) and the project's other
errors (a request's invalid input) keep their own meaning.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from indexer.errors import (
    CollectionUnavailable,
    DatabaseUnavailable,
    VectorStoreBusy,
    VectorStoreError,
    VectorStoreIncompatible,
)
from retrieval.errors import CnclipError

log = logging.getLogger(__name__)

RETRY_FIRST_S = 2.0  # first wait before a degraded collection's store is opened again
RETRY_MAX_S = 60.0  # the back-off doubles up to this


@dataclass(frozen=True)
class Degraded:
    """A collection whose store failed: where, with what kind of error, since when."""

    name: str
    stage: str  # open | search | update
    cause: str  # the exception's type (its message is in the server log only)
    since: float  # wall-clock time of the first failure in a row
    failures: int  # failures in a row
    retry_at: float  # monotonic time before which the store is not tried again

    @property
    def summary(self) -> str:
        """What clients are told (GET /v1/collections/{name}): no paths, no library text."""
        return f"its vector store failed to {self.stage} ({self.cause}); searches answer 503 until it opens again"


def is_collection_failure(exc: BaseException) -> bool:
    """Whether `exc`, raised by one collection's store, degrades that collection (see the module
    docstring for what does not)."""
    if isinstance(exc, (DatabaseUnavailable, VectorStoreBusy, VectorStoreIncompatible)):
        return False  # the database's, a moment's, or this request's (a filter the engine cannot run: 501)
    if isinstance(exc, CnclipError):
        return isinstance(exc, VectorStoreError)
    return isinstance(exc, Exception)


class StoreHealth:
    """The degraded collections of one store pool, by collection id. Thread-safe."""

    def __init__(self) -> None:
        self._degraded: dict[int, Degraded] = {}
        self._lock = threading.Lock()

    def get(self, collection_id: int) -> Degraded | None:
        return self._degraded.get(collection_id)

    def all(self) -> dict[int, Degraded]:
        """collection id -> how it is degraded (a copy)."""
        with self._lock:
            return dict(self._degraded)

    def failed(self, collection_id: int, name: str, stage: str, exc: BaseException) -> CollectionUnavailable:
        """Record a failure of the collection's store (one log line, with the traceback the first time
        in a row) and return the error its request answers with."""
        with self._lock:
            before = self._degraded.get(collection_id)
            failures = before.failures + 1 if before is not None else 1
            # The engine's own errors (a Milvus server away) are retried at once, as before: they pass.
            # A failure inside native code or of the files is not retried per request: it backs off.
            wait = 0.0 if isinstance(exc, CnclipError) else min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (failures - 1))
            since = before.since if before is not None else time.time()
            record = Degraded(name, stage, type(exc).__name__, since, failures, time.monotonic() + wait)
            self._degraded[collection_id] = record
        log.log(
            logging.ERROR if before is None else logging.WARNING,
            "collection %s is degraded: its vector store failed to %s (%s: %s); searches answer 503, the others "
            "are served; trying again in %.0f s",
            name, stage, type(exc).__name__, str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else "",
            wait, exc_info=exc if before is None else None,
        )  # fmt: skip
        return self.unavailable(record)

    def check(self, collection_id: int) -> None:
        """`CollectionUnavailable` while the collection waits out its back-off."""
        record = self._degraded.get(collection_id)
        if record is not None and time.monotonic() < record.retry_at:
            raise self.unavailable(record)

    def recovered(self, collection_id: int) -> None:
        with self._lock:
            record = self._degraded.pop(collection_id, None)
        if record is not None:
            log.info("collection %s: vector store open again after %d failures", record.name, record.failures)

    def forget(self, collection_id: int) -> None:
        """The collection is gone (deleted): nothing to report any more."""
        with self._lock:
            self._degraded.pop(collection_id, None)

    @staticmethod
    def unavailable(record: Degraded) -> CollectionUnavailable:
        return CollectionUnavailable(
            f"collection {record.name!r} is degraded: {record.summary}; the other collections are served. "
            f"Retry in {max(1, round(record.retry_at - time.monotonic()))} s."
        )
