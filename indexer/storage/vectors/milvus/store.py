"""The Milvus engine (`CNCLIP_VECTOR_STORE=milvus`): one Milvus collection per cnclip collection.

`CNCLIP_MILVUS_URI` is a local `*.db` path (embedded Milvus Lite, run by pymilvus inside this
process) or `http(s)://host:19530` (a Milvus server or cluster; same code, optional token).

A collection is named `cnclip_<vector_key>` (the key is never reused, so a collection deleted and
made again under the same name never meets the old vectors). Primary key = the SQL item id, a
FLOAT_VECTOR, and the fields filters look at: mime, created_at and taken_at (microseconds, naive
UTC like SQL) and tags, so tag / mime / date filters run inside Milvus and a filtered search returns k hits
whenever k items pass. The model, dimension and index description are collection properties: a
collection whose properties disagree with SQL is dropped and rebuilt from SQL.

What the Milvus supports (milvus_plan.MilvusCapabilities: nullable fields, filter templates, index
types) is decided once at connect from the server's version; a server older than 2.3 is refused
there, naming the minimum. Every read asks for its consistency itself (not the collection's
default, which is Bounded for a collection made by anyone else). Searches ask for Session: a
process sees its own writes as soon as the call returns, and every process applies the changes it
sees in SQL to Milvus itself (sync.py), so it reads what it caught up to; Strong would wait for the
server's next time tick on every search (200 ms per search on 2.3.5, measured by
benchmarks/bench_engines.py). Counts and id lists (stats, reconcile) ask for Strong. A Milvus error
is `VectorStoreIncompatible` when retrying cannot cure it (a parse error, an unsupported feature),
else `VectorStoreUnavailable`.

Milvus Lite takes one process per file (indexer/storage/vectors/milvus/lite.py: a process that finds the file held
is told which process holds it).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pymilvus import DataType, MilvusClient, MilvusException

from indexer.config import StorageSettings
from indexer.domain.records import SearchFilters
from indexer.storage.vectors.base import (
    FetchVectors,
    FilterIds,
    ItemAttrs,
    SearchTuning,
    StoreSpec,
    VectorStoreIncompatible,
    VectorStoreUnavailable,
)
from indexer.storage.vectors.milvus.lite import check_lite_file, is_lite, open_lite, release_lite
from indexer.storage.vectors.milvus.plan import (
    LITE,
    MAX_TOPK,
    MISSING_MIME,
    NO_TAKEN,
    NOTHING,
    IndexPlan,
    MilvusCapabilities,
    filter_arguments,
    is_permanent,
    micros,
    plan_index,
    server_capabilities,
)

log = logging.getLogger(__name__)

BATCH = 2_000  # rows per insert / delete / query-iterator page
MAX_TAGS = 4_096  # Milvus's bound on an ARRAY field's capacity
PROPERTY_KEYS = ("cnclip.model", "cnclip.dim", "cnclip.index", "cnclip.fields")
# The scalar fields a collection holds; a collection made with older ones is rebuilt from SQL.
FIELDS = "mime,created_at,tags,taken_at"
# Consistency asked for by each read itself (module docstring): searches see this process's writes;
# counts, id lists and the wait after a delete see every process's (rare calls: Strong's wait is fine).
SEARCH_READ = {"consistency_level": "Session"}
EXACT_READ = {"consistency_level": "Strong"}


class _ClientSideSnapshot(logging.Filter):
    """A server before 2.4 returns no snapshot timestamp to a query iterator; pymilvus then warns
    `failed to get mvccTs` on every `ids()` and uses its own clock plus one second as the snapshot.
    Harmless here: that snapshot holds every write acknowledged before the call (the server waits
    until its clock passes it), which is all reconciling needs. Drop exactly that warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("failed to get mvccTs")


class MilvusStore:
    """`VectorStore` over one Milvus collection."""

    def __init__(self, engine: MilvusEngine, spec: StoreSpec, plan: IndexPlan, fetch: FetchVectors) -> None:
        self.engine = engine
        self.spec = spec
        self.plan = plan
        self.fetch = fetch
        self.name = collection_name(spec)
        self.problem: str | None = None  # set when the collection was rebuilt (sync.py logs it)
        self._dirty = False

    def upsert(self, ids: np.ndarray, vectors: np.ndarray, attrs: Sequence[ItemAttrs]) -> None:
        # Milvus upsert replaces a row by primary key; the vector of an id never changes, so a
        # second upsert of the same change rewrites the same row: idempotent, never a duplicate.
        ids = np.asarray(ids, dtype=np.int64)
        vectors = np.asarray(vectors, dtype=np.float32)
        for start in range(0, len(ids), BATCH):
            rows = [
                {
                    "id": int(item_id),
                    "vector": vector,
                    "mime": attr.mime or MISSING_MIME,  # no nulls: see milvus_plan.py
                    "created_at": micros(attr.created_at),
                    "taken_at": micros(attr.taken_at) if attr.taken_at is not None else NO_TAKEN,
                    "tags": list(attr.tags[:MAX_TAGS]),
                }
                for item_id, vector, attr in zip(
                    ids[start : start + BATCH],
                    vectors[start : start + BATCH],
                    attrs[start : start + BATCH],
                    strict=True,
                )
            ]
            self.engine.call(lambda rows=rows: self.engine.client().upsert(self.name, rows))
            self._dirty = True

    def remove(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        for start in range(0, len(ids), BATCH):
            part = [int(i) for i in ids[start : start + BATCH]]
            self.engine.call(lambda part=part: self.engine.client().delete(self.name, ids=part))  # absent ids: no-op
            self._dirty = True
        if len(ids):
            # Session reads follow this process's upserts, not its deletes (pymilvus records no
            # timestamp for a delete): one Strong read waits until the server applied them, so
            # every later read, in any process, sees them.
            self.engine.call(
                lambda: self.engine.client().query(
                    self.name, filter=NOTHING, output_fields=["id"], limit=1, **EXACT_READ
                )
            )

    def search(self, query: np.ndarray, k: int, filters: SearchFilters | None = None) -> tuple[np.ndarray, np.ndarray]:
        # Compressed codes give approximate scores: fetch more candidates and re-rank them exactly.
        limit = min(k * self.engine.tuning.rerank_factor if self.plan.compressed else k, MAX_TOPK)
        kwargs: dict[str, Any] = {"limit": limit, "search_params": self.plan.search_params(self.engine.tuning, limit)}
        filtered = filter_arguments(filters, self.engine.capabilities())
        kwargs.update(filtered)
        vector = np.asarray(query, dtype=np.float32).reshape(-1)
        hits = self._search(vector, kwargs)
        if filtered and len(hits) < limit and self.plan.index_type != "FLAT":
            # An approximate index may visit too few candidates that pass a narrow filter (IVF lists
            # not probed, an HNSW walk cut short): search again exhaustively, so that a filtered
            # search still returns k hits whenever k items pass.
            kwargs["search_params"] = self.plan.exhaustive_params(limit)
            hits = self._search(vector, kwargs)
        ids = np.fromiter((hit["id"] for hit in hits), dtype=np.int64, count=len(hits))
        scores = np.fromiter((hit["distance"] for hit in hits), dtype=np.float32, count=len(hits))
        if self.plan.compressed and len(ids):
            scores = self.fetch(ids) @ vector
            order = np.argsort(-scores, kind="stable")[:k]
            ids, scores = ids[order], scores[order]
        return ids, scores.astype(np.float32)

    def _search(self, vector: np.ndarray, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        result = self.engine.call(
            lambda: self.engine.client().search(
                self.name, data=[vector.tolist()], output_fields=["id"], **kwargs, **SEARCH_READ
            )
        )
        return list(result[0]) if result else []

    def count(self) -> int:
        rows = self.engine.call(
            lambda: self.engine.client().query(self.name, filter="", output_fields=["count(*)"], **EXACT_READ)
        )
        return int(rows[0]["count(*)"])

    def ids(self) -> np.ndarray:
        def every_id() -> np.ndarray:
            found: list[int] = []
            iterator = self.engine.client().query_iterator(
                self.name, batch_size=BATCH, filter="", output_fields=["id"], **EXACT_READ
            )
            try:
                while page := iterator.next():
                    found.extend(int(row["id"]) for row in page)
            finally:
                iterator.close()
            return np.asarray(found, dtype=np.int64)

        return self.engine.call(every_id)

    def save(self) -> None:
        """Lite: seal what was written into indexed segments (the next search uses the index, not a
        scan of the write buffer). A server seals segments itself; its flush is rate-limited."""
        if self.engine.lite and self._dirty:
            self.engine.call(lambda: self.engine.client().flush(self.name))
        self._dirty = False

    def close(self) -> None:
        self.save()


class MilvusEngine:
    """`VectorEngine` over a `MilvusClient`, connected on first use (a process that only writes SQL
    never touches Milvus until it flushes)."""

    name = "milvus"

    def __init__(self, uri: str, token: str, tuning: SearchTuning) -> None:
        self.lite = is_lite(uri)
        if self.lite and not uri.endswith(".db"):
            raise VectorStoreUnavailable(f"a Milvus Lite path must end in .db (or use http://host:19530): {uri!r}")
        self.uri = str(Path(uri).resolve()) if self.lite else uri
        self.token = token
        self.tuning = tuning
        self._client: MilvusClient | None = None
        self._capabilities: MilvusCapabilities | None = LITE if self.lite else None
        self._connect_lock = threading.Lock()

    # --- connection ------------------------------------------------------------------------------
    def client(self) -> MilvusClient:
        if self._client is None:
            with self._connect_lock:
                if self._client is None:
                    self._client = self._connect()
        return self._client

    def capabilities(self) -> MilvusCapabilities:
        """What this Milvus supports (connects first, for a server: its version decides)."""
        if self._capabilities is None:
            self.client()
        assert self._capabilities is not None
        return self._capabilities

    def _connect(self) -> MilvusClient:
        started = time.perf_counter()
        if not self.lite:
            return self._connect_server()
        client = open_lite(Path(self.uri))
        log.info("Milvus Lite %s opened in %.2f s", self.uri, time.perf_counter() - started)
        return client

    def _connect_server(self) -> MilvusClient:
        """A client of the server, and its capabilities from its version (asked once, here)."""
        iterator_log = logging.getLogger("pymilvus.client.iterator.query_iterator")
        if not any(isinstance(f, _ClientSideSnapshot) for f in iterator_log.filters):
            iterator_log.addFilter(_ClientSideSnapshot())
        try:
            client = MilvusClient(uri=self.uri, token=self.token)
            version = str(client.get_server_version())
        except MilvusException as exc:
            raise VectorStoreUnavailable(f"cannot reach Milvus at {self.uri}: {exc.message}") from exc
        try:
            self._capabilities = server_capabilities(version)
        except VectorStoreIncompatible as exc:
            client.close()
            raise VectorStoreIncompatible(f"Milvus at {self.uri}: {exc.message}") from exc
        log.info("Milvus at %s: %s", self.uri, self._capabilities)
        return client

    def call(self, action: Any) -> Any:
        """Run one client call; a Milvus error becomes the project's error (never a raw one):
        `VectorStoreIncompatible` when retrying cannot cure it, else `VectorStoreUnavailable`."""
        try:
            return action()
        except MilvusException as exc:
            if is_permanent(exc.code, exc.message):
                label = self._capabilities.label if self._capabilities else "Milvus"
                raise VectorStoreIncompatible(f"{label} at {self.uri} refused the request: {exc.message}") from exc
            raise VectorStoreUnavailable(f"Milvus at {self.uri} failed: {exc.message}") from exc

    # --- VectorEngine --------------------------------------------------------------------------
    def check(self) -> None:
        """Connect to a server now and learn what it supports (Lite: nothing to ask, but its file must
        be one it can use)."""
        if self.lite:
            check_lite_file(Path(self.uri))
        self.capabilities()

    def validate(self, index: str, dim: int) -> None:
        """`InvalidInput` unless `index` maps to a Milvus index (milvus_plan.py)."""
        plan_index(index, dim, self.capabilities())

    def open(self, spec: StoreSpec, fetch: FetchVectors, filter_ids: FilterIds) -> MilvusStore:
        """The collection as Milvus holds it, created empty when missing and remade when its
        properties disagree with SQL or it has no index (sync.py then fills it from SQL)."""
        plan = plan_index(spec.index, spec.dim, self.capabilities())
        store = MilvusStore(self, spec, plan, fetch)
        client = self.client()
        wanted = {
            "cnclip.model": spec.model,
            "cnclip.dim": str(spec.dim),
            "cnclip.index": spec.index,
            "cnclip.fields": FIELDS,
        }
        if self.call(lambda: client.has_collection(store.name)):
            properties = self.call(lambda: client.describe_collection(store.name)).get("properties", {})
            held = {key: properties.get(key) for key in PROPERTY_KEYS}
            # Creating is three calls (collection, index, load): a process killed between the first two
            # leaves a collection, empty, that no load accepts ("index not found") — made again.
            indexed = held == wanted and bool(self.call(lambda: client.list_indexes(store.name)))
            if indexed:
                self.call(lambda: client.load_collection(store.name))
                return store
            self.call(lambda: client.drop_collection(store.name))
            store.problem = (
                f"the Milvus collection held {held}, not {wanted}"
                if held != wanted
                else "it had no index: a create that did not finish"
            )
        self._create(store.name, spec, plan, wanted)
        return store

    def _create(self, name: str, spec: StoreSpec, plan: IndexPlan, properties: dict[str, str]) -> None:
        client = self.client()
        supports = self.capabilities()
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=spec.dim)
        # MISSING_MIME, never a null, is written either way: nullable only where it exists (Lite, 2.5+).
        schema.add_field("mime", DataType.VARCHAR, max_length=256, nullable=supports.nullable_fields)
        schema.add_field("created_at", DataType.INT64)
        schema.add_field("taken_at", DataType.INT64)  # NO_TAKEN when unknown
        schema.add_field("tags", DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=MAX_TAGS, max_length=1024)
        params: dict[str, Any] = dict(plan.params)
        if supports.legacy_index_params:
            params["params"] = json.dumps(plan.params)
        index = client.prepare_index_params()
        index.add_index("vector", index_type=plan.index_type, metric_type="IP", params=params)

        def create() -> None:
            client.create_collection(
                name, schema=schema, index_params=index, properties=properties, consistency_level="Strong"
            )

        try:
            self.call(create)
        except VectorStoreUnavailable as exc:
            orphan = Path(self.uri) / "collections" / name
            if not (self.lite and orphan.is_dir() and "File exists" in exc.message):
                raise
            # A process killed inside Lite's create_collection leaves the folder but no catalog entry,
            # and Lite then refuses the name for good. Lite does not know the collection (has_collection
            # said so), so nothing of value is in it: remove it and create again.
            log.warning("Milvus Lite: removing %s, left by a create that did not finish", orphan)
            shutil.rmtree(orphan)
            self.call(create)
        self.call(lambda: client.load_collection(name))

    def drop(self, spec: StoreSpec) -> None:
        name = collection_name(spec)
        client = self.client()
        if self.call(lambda: client.has_collection(name)):
            self.call(lambda: client.drop_collection(name))

    def close(self) -> None:
        with self._connect_lock:
            client, self._client = self._client, None
        if client is None:
            return
        client.close()
        if self.lite:
            release_lite(Path(self.uri))


def open_engine(settings: StorageSettings, database_url: str) -> MilvusEngine:
    """The registry's opener (indexer/storage/vectors/registry.py): Milvus at `CNCLIP_MILVUS_URI` (a Lite file or a
    server); the database URL plays no part (collections are named by their vector key)."""
    from indexer.storage.vectors.registry import search_tuning

    token = settings.milvus_token.get_secret_value() if settings.milvus_token else ""
    return MilvusEngine(settings.milvus_uri_or_default, token, search_tuning(settings))


def collection_name(spec: StoreSpec) -> str:
    if not spec.vector_key.isalnum() or not spec.vector_key.isascii():
        raise VectorStoreUnavailable(f"collection {spec.name!r} has an unusable vector key")
    return f"cnclip_{spec.vector_key}"
