"""Opening the vector engine the settings name (the records: indexer/engines.py): its module is imported
only now, when it is chosen, so `cnclip demo` never imports pymilvus; and the search tuning every
engine reads from the settings."""

from __future__ import annotations

import importlib
from typing import cast

from indexer.config import StorageSettings
from indexer.engines import engine_record
from indexer.storage.vectors.base import SearchTuning, VectorEngine
from retrieval.errors import InvalidInput


def search_tuning(settings: StorageSettings) -> SearchTuning:
    """The settings' search tuning, which every engine reads."""
    return SearchTuning(
        rerank_factor=settings.search_rerank_factor,
        nprobe=settings.index_nprobe,
        ef_search=settings.index_ef_search,
        train_min=settings.index_train_min,
        auto_ivf_min=settings.index_auto_ivf_min,
    )


def open_vector_engine(settings: StorageSettings, database_url: str) -> VectorEngine:
    """The engine `CNCLIP_VECTOR_STORE` names, for the catalog at `database_url` (one per catalog)."""
    record = engine_record(settings.vector_store)
    try:
        module = importlib.import_module(record.module)
    except ImportError as exc:
        hint = f" (pip install 'cnclip-search[{record.extra}]')" if record.extra else ""
        raise InvalidInput(f"the {record.name} vector engine is not installed{hint}: {exc}") from exc
    return cast(VectorEngine, module.open_engine(settings, database_url))
