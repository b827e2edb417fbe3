"""Which vector engine a catalog uses, from the settings (`CNCLIP_VECTOR_STORE`)."""

from __future__ import annotations

import hashlib
from typing import Any

from indexer.vector_index import SearchTuning
from indexer.vector_store import VectorEngine


def search_tuning(settings: Any) -> SearchTuning:
    return SearchTuning(
        rerank_factor=settings.search_rerank_factor,
        nprobe=settings.index_nprobe,
        ef_search=settings.index_ef_search,
        train_min=settings.index_train_min,
    )


def open_vector_engine(settings: Any, database_url: str) -> VectorEngine:
    """FAISS files under the data dir (one folder per database, so two databases sharing a data dir
    never share index files), or Milvus at `CNCLIP_MILVUS_URI` (imported only when chosen)."""
    tuning = search_tuning(settings)
    if settings.vector_store == "milvus":
        from indexer.milvus_store import MilvusEngine

        token = settings.milvus_token.get_secret_value() if settings.milvus_token else ""
        return MilvusEngine(settings.milvus_uri_or_default, token, tuning)
    from indexer.faiss_store import FaissEngine

    url_key = hashlib.sha1(database_url.encode()).hexdigest()[:10]
    return FaissEngine(settings.data_dir / "indexes" / url_key, tuning, settings.index_save_interval_s)
