"""The settings users configure: the HTTP server's part on top of the catalog's and the model
runtime's (retrieval/config.py explains the layers). The settings table in docs/settings.md lists every field."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from indexer.config import StorageSettings
from indexer.watch.settings import parse_watch_setting


class Settings(StorageSettings):
    """Everything `cnclip serve` reads from `CNCLIP_*`."""

    host: str = Field("127.0.0.1", description="Address `cnclip serve` binds.")
    port: int = Field(8000, ge=0, le=65535, description="Port `cnclip serve` binds.")
    api_key: SecretStr | None = Field(
        None,
        description="Key required for writes (Bearer or X-API-Key). Set but empty (or blank) is refused at start: "
        "unset it to serve without a key. Compared as UTF-8 bytes with the header's bytes (docs/api.md#api-key).",
    )
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
        description="`/readyz` asks the database (one indexed read, off the event loop) and, with "
        "`CNCLIP_ENCODER=triton://…`, the remote's `/v2/health/ready` (2 s timeout) at most this often; "
        "it answers 503 while either is down.",
    )

    # Parsed by the validator (not by the settings source), so that bad JSON is one line like any bad value.
    watch: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description='Folders `cnclip serve` watches, as JSON folder → collection: `{"/srv/photos": "photos"}`. '
        "Absolute folders; each is indexed at start, then kept in step (see docs/indexing.md#watched-folders). "
        "A folder named twice, or a collection its watcher would refuse (a text collection), stops the server at start.",
    )

    @field_validator("watch", mode="before")
    @classmethod
    def _watch_list(cls, value: Any) -> dict[str, str]:
        return parse_watch_setting(value)

    @field_validator("api_key")
    @classmethod
    def _key_not_blank(cls, value: SecretStr | None) -> SecretStr | None:
        # `CNCLIP_API_KEY=` would otherwise be a key that an empty header matches, or be read as "no key"
        # without a word: either way not what the operator meant.
        if value is not None and not value.get_secret_value().strip():
            raise ValueError("set but empty; set a key, or unset it to serve without one")
        if value is not None:
            key = value.get_secret_value()
            # The key is compared as UTF-8 bytes with the header's (api/deps.py): bytes that are not UTF-8
            # (read from the environment as lone surrogates), control characters and outer spaces (headers
            # cannot carry them, or lose them) would make a key no client can ever send.
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("is not UTF-8 text; set a key of UTF-8 characters") from None
            if key != key.strip() or any(ord(c) < 32 or ord(c) == 127 for c in key):
                raise ValueError("holds control characters or outer spaces, which no HTTP header can carry")
        return value
