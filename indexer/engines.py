"""Opening a catalog from the settings: the database (migrated to the newest schema) and the vector
engine `CNCLIP_VECTOR_STORE` names."""

from __future__ import annotations

import hashlib
from typing import Any

from indexer.catalog import SqlCatalog
from indexer.db import create_db_engine, upgrade
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


def open_catalog(settings: Any, *, open_stores: bool = True, sweep_media: bool = False) -> SqlCatalog:
    """Migrate the database to the newest schema and open it with the configured vector engine;
    `open_stores` also opens and reconciles every collection's store now (a server), instead of on
    first use (a process that only writes); `sweep_media` removes the upload copies and temp files
    a killed process left (`cnclip serve` and `cnclip index` at start)."""
    engine = create_db_engine(settings.sqlalchemy_url)
    upgrade(engine)
    catalog = SqlCatalog(
        engine,
        settings.data_dir,
        open_vector_engine(settings, engine.url.render_as_string(hide_password=True)),
        sync_interval_s=settings.sync_interval_s,
        max_image_bytes=settings.max_image_bytes,
        max_image_pixels=settings.max_image_pixels,
    )
    if sweep_media:
        catalog.sweep_media()
    if open_stores:
        catalog.reconcile_all()
    return catalog
