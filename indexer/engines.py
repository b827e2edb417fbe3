"""The registry of vector engines: one record per value of `CNCLIP_VECTOR_STORE`, and the only
place that chooses an engine by name.

A record says where the engine lives (a module with `open_engine(settings, database_url)`, imported
only when the engine is chosen, by indexer/storage/vectors/registry.py: `cnclip demo` never imports
pymilvus), which pip extra installs it, what it is good for, and what a serving process sets up for
it. The settings (indexer/config.py) check `CNCLIP_VECTOR_STORE` against these names without importing
any engine; everything else talks to the engine through the `VectorEngine` protocol
(indexer/storage/vectors/base.py).

Milvus Lite and a Milvus server are one record: one setting value, and `CNCLIP_MILVUS_URI` alone
moves a collection from one to the other (a `*.db` path is Lite, `http://…` a server). What differs
between them (one process per Lite file; the server's version decides nullable fields, filter
templates and index types) is decided at connect (indexer/storage/vectors/milvus/).

Adding an engine: a package under indexer/storage/vectors/ with `open_engine(settings, database_url) ->
VectorEngine` (and its `VectorStore`), plus one line in `ENGINES` (docs/architecture.md walks through it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from retrieval.errors import InvalidInput


def _nothing() -> None:
    return None


def _faiss_one_thread_per_search() -> None:
    # One request = one small FAISS search; the server runs many of them at once on its worker
    # threads. FAISS's own OpenMP threads per search only spin against each other (measured on
    # a busy 2-core host: 27 ms -> 0.1 ms per search of a small collection with one thread).
    import faiss

    faiss.omp_set_num_threads(1)


@dataclass(frozen=True)
class EngineRecord:
    """One vector engine: its `CNCLIP_VECTOR_STORE` name and where its opener lives."""

    name: str
    module: str  # has `open_engine(settings, database_url) -> VectorEngine`
    summary: str  # what it is, for users (docs/architecture.md, the settings error)
    extra: str | None = None  # the pip extra that installs its client (`pip install cnclip-search[milvus]`)
    # Called once by a serving process (`cnclip serve`) before it opens the catalog.
    prepare_for_serving: Callable[[], None] = field(default=_nothing, compare=False)


ENGINES: dict[str, EngineRecord] = {
    record.name: record
    for record in (
        EngineRecord(
            "faiss",
            "indexer.storage.vectors.faiss.store",
            "FAISS files under the data dir: embedded, every process keeps its own copy caught up from SQL",
            prepare_for_serving=_faiss_one_thread_per_search,
        ),
        EngineRecord(
            "milvus",
            "indexer.storage.vectors.milvus.store",
            "Milvus: a Lite *.db file (one process at a time) or a server/cluster at http://host:19530",
            extra="milvus",
        ),
    )
}


def engine_record(name: str) -> EngineRecord:
    """The record `CNCLIP_VECTOR_STORE=name` selects; `InvalidInput` naming the choices otherwise."""
    record = ENGINES.get(name)
    if record is None:
        raise InvalidInput(f"unknown vector engine {name!r}: choose one of {', '.join(ENGINES)}")
    return record
