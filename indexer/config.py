"""The catalog's settings (database, vector engine, indexing), on top of the model runtime's:
`cnclip index` needs both. See retrieval/config.py for how the layers compose."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from indexer.domain.index_spec import InvalidIndexDescription, parse_index
from indexer.engines import engine_record
from indexer.watch.settings import WatchTuning
from retrieval.config import RuntimeSettings
from retrieval.errors import InvalidInput
from retrieval.machine_limits import io_threads_refusal


class StorageSettings(WatchTuning, RuntimeSettings):
    """The storage layer's part (with the folder watchers' tuning, indexer/watch/settings.py)."""

    database_url: str | None = Field(
        None, description="SQLAlchemy URL; empty = SQLite file `catalog.db` under the data dir."
    )
    database_pool_size: int = Field(
        10,
        ge=2,
        le=1000,
        description="Database connections each process keeps (no overflow); writers take at most half, reads the "
        "rest. On PostgreSQL, replicas × this + the other processes must stay under `max_connections` "
        "(docs/scaling-out.md#database-connections).",
    )
    index_factory: str = Field(
        "Auto",
        description="Index of new collections: Auto, Flat, HNSW{M}, IVF{n},Flat or IVF{n},PQ{m}[x{bits}], e.g. HNSW32, "
        "IVF4096,Flat, IVF4096,PQ64 (Milvus: IVF_FLAT with nlist 1024 for Auto, else FLAT, HNSW, IVF_FLAT, IVF_PQ). Auto "
        "is Flat below `CNCLIP_INDEX_AUTO_IVF_MIN` vectors, then IVF{≈4√n},Flat searched as deep as recall@10 ≥ 0.95 "
        "needs, trained in the background again each time the collection grows 4× (docs/indexing.md#auto). Existing "
        "collections keep the index they were made with.",
    )
    index_train_min: int = Field(
        10_000,
        ge=1,
        description="Vectors a collection needs before a non-Flat factory is trained (Flat until then); never fewer "
        "than the index's trained parts need (39 per IVF list, 2^bits per PQ codebook: 256 for `PQ…x8`).",
    )
    index_auto_ivf_min: int = Field(
        20_000,
        ge=1,
        description="Vectors an `Auto` collection holds before it moves from Flat to IVF (measured: "
        "docs/indexing.md#auto).",
    )
    # Bounded where they enter: they reach FAISS's C++ ints (an `OverflowError` inside a search made the
    # collection degraded) and size each search's work.
    search_rerank_factor: int = Field(
        4,
        ge=1,
        le=100,
        description="Indexes with compressed codes (PQ, SQ) fetch k × this many candidates and re-rank them exactly "
        "(1–100).",
    )
    index_nprobe: int = Field(64, ge=1, le=65_536, description="IVF lists visited per search (1–65536).")
    index_ef_search: int = Field(128, ge=1, le=65_536, description="HNSW candidate list size per search (1–65536).")
    index_batch_size: int = Field(32, ge=1, description="Images per embedding batch and per commit in `cnclip index`.")
    index_read_threads: int = Field(
        2,
        ge=1,
        description="Threads reading and hashing files in `cnclip index`; at most 4 per core this process may run on.",
    )
    index_save_interval_s: float = Field(
        30.0, ge=0, description="Longest time the FAISS file lags behind SQL (it is caught up from SQL on open)."
    )
    vector_store: str = Field(
        "faiss", description="Vector engine: `faiss` files under the data dir, or `milvus` (Lite file or server)."
    )
    milvus_uri: str | None = Field(
        None,
        description="Milvus: a local file path runs embedded Milvus Lite (one process at a time); "
        "`http://host:19530` talks to a Milvus server or cluster. Empty = `milvus.db` under the data dir.",
    )
    milvus_token: SecretStr | None = Field(None, description="Milvus server token (`user:password` or an API key).")
    sync_interval_s: float = Field(
        0.5,
        ge=0,
        le=60,
        description="How often a search checks (one indexed SQL query) whether another process changed its collection.",
    )
    max_collections: int = Field(1000, ge=1, description="Most collections a catalog may hold (creation beyond: 409).")
    duplicate_threshold: float | None = Field(
        None,
        ge=0.5,
        le=1.0,
        description="Cosine at which two photos are similar shots (`cnclip duplicates`); unset = calibrated on "
        "each collection with its model (the tier is off when the model cannot separate shots from other photos "
        "there). See docs/duplicates.md.",
    )
    duplicate_time_budget_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Longest a duplicates request searches for similar shots; then it answers with what it found "
        "(marked partial) and the next request goes on.",
    )

    @field_validator("index_read_threads")
    @classmethod
    def _readers_fit_the_cores(cls, value: int) -> int:
        refusal = io_threads_refusal(value)
        if refusal is not None:
            raise ValueError(refusal)
        return value

    @field_validator("database_url")
    @classmethod
    def _parsed_url(cls, value: str | None) -> str | None:
        # Parsed now, so that a malformed URL is one line at start, not SQLAlchemy's traceback later.
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        if value:
            try:
                value.encode("utf-8")  # bytes that are not UTF-8 in the environment reach no driver
                url = make_url(value)
            except UnicodeEncodeError:
                raise ValueError(f"is not UTF-8 text ({ascii(value)[:120]})") from None
            except (ArgumentError, ValueError) as exc:
                raise ValueError(f"not a database URL ({str(exc).splitlines()[0][:120]})") from None
            if url.get_backend_name() not in ("sqlite", "postgresql"):  # no other driver is installed
                raise ValueError(
                    f"{url.get_backend_name()!r} is not a supported database: use sqlite:/// or postgresql://"
                )
        return value

    @field_validator("index_factory")
    @classmethod
    def _parsed_index(cls, value: str) -> str:
        # The grammar of indexer/domain/index_spec.py (the vector dimension is checked when a collection is made).
        try:
            return parse_index(value).description
        except InvalidIndexDescription as exc:
            raise ValueError(exc.message) from None

    @field_validator("vector_store")
    @classmethod
    def _known_engine(cls, value: str) -> str:
        # The names are the registry's (indexer/engines.py): an engine added there is a valid value here.
        try:
            return engine_record(value).name
        except InvalidInput as exc:
            raise ValueError(exc.message) from None

    @property
    def milvus_uri_or_default(self) -> str:
        return self.milvus_uri or str(self.data_dir / "milvus.db")

    @property
    def sqlalchemy_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'catalog.db'}"
