"""The storage layer's errors, in one module: what the catalog, the vector engines, the database and
the media files raise. Each carries a stable `code` and no HTTP status or exit code: the outer layers
map them (api/errors.py `STATUS_BY_ERROR`, cli/errors.py `EXIT_BY_ERROR`)."""

from __future__ import annotations

from retrieval.errors import CnclipError


class DatabaseUnavailable(CnclipError):
    """The SQL database cannot be reached or is locked for now: retryable (the API answers 503)."""

    code = "database_unavailable"


class DatabaseRefused(DatabaseUnavailable):
    """The file at the database URL is not a cnclip catalog (empty, not SQLite, another schema)."""

    code = "database_refused"


class StorageFull(CnclipError):
    """The disk (or the quota) under the data dir or the database is full: nothing was stored."""

    code = "storage_full"


class MediaChanged(CnclipError):
    """The file at an item's indexed path no longer holds the bytes that were indexed."""

    code = "gone"


class VectorStoreError(CnclipError):
    """The vector engine cannot do it now or ever (the three below). SQL is unaffected: what SQL knows
    can still be answered (`cnclip stats` does)."""

    code = "vector_store_error"


class VectorStoreBusy(VectorStoreError):
    """The engine's storage is held by another process that cannot share it (a Milvus Lite file
    takes one process); the message names that process."""

    code = "vector_store_busy"


class VectorStoreUnavailable(VectorStoreError):
    """The engine cannot be reached or opened (a Milvus server down, a damaged Milvus Lite file)."""

    code = "vector_store_unavailable"


class CollectionUnavailable(VectorStoreUnavailable):
    """One collection's vector store cannot be opened, built or searched now (a damaged or unreadable
    index file, a failure inside the engine): that collection is degraded and answers 503 while the
    others are served; it is opened again after a back-off (indexer/storage/store_health.py). The message is
    written for clients (it names the collection, not the cause: the server log has that)."""

    code = "collection_unavailable"
    public = True  # the message may reach a client as it is (api/errors.py)


class VectorStoreIncompatible(VectorStoreError):
    """The engine refuses what we ask for good (a Milvus older than the minimum, a request its version
    cannot parse): retrying cannot help, so it is not `VectorStoreUnavailable`'s "retry in a moment"."""

    code = "vector_store_incompatible"


class MigrationRefused(CnclipError):
    """A model migration step that cannot be taken now (indexer/storage/sql/generations.py): a swap before the new
    generation covers every item, a rollback with nothing to go back to, a second migration to another
    model while one runs. The message says what to do instead."""

    code = "migration_refused"


class GenerationMoved(CnclipError):
    """The collection's active model generation changed between reading it and searching it (a swap in
    this or another process): the use case embeds the query again with the new model and retries."""

    code = "generation_moved"
