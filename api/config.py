"""The settings users configure: the HTTP server's part on top of the catalog's and the model
runtime's (retrieval/config.py explains the layers). The README's settings table lists every field."""

from __future__ import annotations

from pydantic import Field, SecretStr

from indexer.config import StorageSettings


class Settings(StorageSettings):
    """Everything `cnclip serve` reads from `CNCLIP_*`."""

    host: str = Field("127.0.0.1", description="Address `cnclip serve` binds.")
    port: int = Field(8000, description="Port `cnclip serve` binds.")
    api_key: SecretStr | None = Field(None, description="Key required for writes (Bearer or X-API-Key).")
    require_key_for_reads: bool = Field(
        False, description="Also require the API key for searches, reads and `/metrics`."
    )
    header_read_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A request's line and headers must arrive within this time, else the connection is closed.",
    )
    body_read_timeout_s: float = Field(
        60.0, gt=0, description="A request's body must arrive within this time of its headers, else 408."
    )
    readiness_interval_s: float = Field(
        2.0,
        gt=0,
        le=300,
        description="`/readyz` asks the database (one indexed read, off the event loop) at most this often; "
        "it answers 503 while the database is down.",
    )
