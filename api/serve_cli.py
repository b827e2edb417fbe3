"""CLI commands of this package (see api/cli.py): `cnclip serve`."""

from __future__ import annotations

import ipaddress
import logging
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from api.config import Settings

# The project's loggers; uvicorn configures only its own, so without this their INFO lines (the
# encoder's provider/precision/buckets line at start-up) would be dropped.
PROJECT_LOGGERS = ("cnclip", "retrieval", "indexer", "api", "demo")


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time (a test runner may swap and close it)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure_logging(level: str) -> None:
    """Send the project's log records to stderr at `level` (uvicorn's level names), in uvicorn's format."""
    numeric = logging.DEBUG if level.lower() == "trace" else getattr(logging, level.upper(), logging.INFO)
    for name in PROJECT_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(numeric)
        if not any(getattr(h, "_cnclip", False) for h in logger.handlers):
            handler = _StderrHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
            handler._cnclip = True  # type: ignore[attr-defined]
            logger.addHandler(handler)


def exit_on_bad_model(settings: Settings) -> None:
    """Fail with one line, not a lifespan traceback, when a local model directory is not usable."""
    if settings.encoder != "local":
        return
    from retrieval.errors import ModelError
    from retrieval.manifest import ModelManifest

    try:
        ModelManifest.load(settings.model_dir, verify=False)
    except ModelError as exc:
        typer.secho(f"error: {exc.message}", fg=typer.colors.RED, err=True)
        typer.echo("Set CNCLIP_MODEL_DIR to a model directory (see `cnclip convert`).", err=True)
        raise typer.Exit(2) from exc


def exit_on_bad_database(settings: Settings) -> None:
    """Fail with one line, not a lifespan traceback, when the SQLite file is not a cnclip catalog
    (empty, not SQLite, another application's schema: indexer/db.py)."""
    from indexer.db import DatabaseRefused, check_database

    try:
        check_database(settings.sqlalchemy_url)
    except DatabaseRefused as exc:
        typer.secho(f"error: {exc.message}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from exc


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def register(app: typer.Typer) -> None:
    """Add this package's commands to the `cnclip` app."""

    @app.command()
    def serve(
        host: Annotated[str | None, typer.Option(help="Address to bind (default: CNCLIP_HOST, 127.0.0.1).")] = None,
        port: Annotated[int | None, typer.Option(help="Port to bind (default: CNCLIP_PORT, 8000).")] = None,
        log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    ) -> None:
        """Serve the REST API and the web UI (loads the model and warms every bucket first)."""
        import faiss
        import uvicorn

        from api.app import create_app
        from api.config import Settings
        from api.slow_clients import guarded_protocol

        # One request = one small FAISS search; the server runs many of them at once on its worker
        # threads. FAISS's own OpenMP threads per search only spin against each other (measured on
        # a busy 2-core host: 27 ms -> 0.1 ms per search of a small collection with one thread).
        faiss.omp_set_num_threads(1)

        settings = Settings()
        overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
        settings = settings.model_copy(update=overrides)
        if settings.api_key is None and not _is_loopback(settings.host):
            typer.secho(
                f"warning: serving on {settings.host} without CNCLIP_API_KEY: anyone who can reach it can write",
                fg=typer.colors.YELLOW,
                err=True,
            )
        exit_on_bad_model(settings)
        exit_on_bad_database(settings)
        configure_logging(log_level)
        typer.echo(f"cnclip: model {settings.model_dir}, data {settings.data_dir}")
        uvicorn.run(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_level=log_level,
            # The encoder's batcher merges concurrent requests; one process owns the model and the index.
            workers=1,
            timeout_graceful_shutdown=10,
            # Longer than clients' and proxies' idle pools (httpx: 5 s), so that the server never closes
            # a kept-alive connection just as a client sends on it (a reset, not a retry, for a POST).
            timeout_keep_alive=30,
            # Slow or endless request heads close the connection (bodies have their own deadline in the app).
            http=guarded_protocol(settings.header_read_timeout_s),
        )
