"""CLI commands of this package (see api/cli.py): `cnclip serve`."""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import TYPE_CHECKING, Annotated, Any

import typer

from api.cli_logging import SERVER_FORMAT, configure_logging, uvicorn_level, verbosity_level

if TYPE_CHECKING:
    from api.config import Settings

EXIT_ERROR = 1  # api/cli.py EXIT_STATUS: a server that cannot start is an error, like any other


def load_settings() -> Settings:
    """`Settings()` from the environment; a bad value (an empty `CNCLIP_API_KEY`, say) is one line per
    setting on stderr and exit status 2, not a traceback."""
    from pydantic import ValidationError

    from api.config import Settings

    try:
        return Settings()
    except ValidationError as exc:
        for error in exc.errors():
            name = "CNCLIP_" + "__".join(str(part) for part in error["loc"]).upper()
            message = str(error["msg"]).removeprefix("Value error, ")
            typer.secho(f"error: {name}: {message}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


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


def bind_listener(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the model loads: a busy port fails at once, in one line and
    with status 1, not after the warm-up. uvicorn then serves on this very socket, so no other
    process can take the port in between."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP, as uvicorn's own: asyncio sets TCP_NODELAY only on sockets that say they are
    # TCP, and without it Nagle + delayed ACKs add ~40 ms to every POST.
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restarts reuse the port
    try:
        listener.bind((host, port))
    except (OSError, OverflowError) as exc:  # in use, not an address of this host, a port out of range
        listener.close()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        typer.secho(f"error: cannot listen on {host}:{port}: {reason}", fg=typer.colors.RED, err=True)
        raise typer.Exit(EXIT_ERROR) from None
    return listener


def run_server(app: Any, listener: socket.socket, **options: Any) -> None:
    """Serve `app` with uvicorn on `listener` (from `bind_listener`). An app whose start-up fails
    (its log says why) exits with status 1; uvicorn's own 3 is `cnclip index`'s in the README."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    host, port = listener.getsockname()[:2]

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            # uvicorn says where it listens only for sockets it bound itself.
            logging.getLogger("uvicorn.error").info(
                "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", host, port
            )

    server = Server(uvicorn.Config(app, host=host, port=port, **options))
    try:
        server.run(sockets=[listener])
    except SystemExit as exc:
        if exc.code != STARTUP_FAILURE:
            raise
        raise typer.Exit(EXIT_ERROR) from None
    finally:
        listener.close()


def project_log_level(ctx: typer.Context, log_level: str) -> int:
    """The project loggers' level for a server: its `--log-level`, or lower with the global `-v`."""
    verbose = ctx.find_root().params.get("verbose") or 0
    return min(uvicorn_level(log_level), verbosity_level(verbose))


def exit_on_unusable_vector_store(settings: Settings) -> None:
    """Fail with one line, not a lifespan traceback, when the vector engine cannot be used: a Milvus
    server older than the minimum (named in the message) or one that cannot be reached."""
    from indexer.engines import open_vector_engine
    from indexer.vector_store import VectorStoreIncompatible, VectorStoreUnavailable

    engine = open_vector_engine(settings, settings.sqlalchemy_url)
    try:
        engine.check()
    except (VectorStoreIncompatible, VectorStoreUnavailable) as exc:
        typer.secho(f"error: {exc.message}", fg=typer.colors.RED, err=True)
        raise typer.Exit(EXIT_ERROR) from exc
    finally:
        engine.close()


def exit_on_bad_database(settings: Settings) -> None:
    """Fail with one line, not a lifespan traceback, when the SQLite file is not a cnclip catalog
    (empty, not SQLite, another application's schema: indexer/db.py)."""
    from indexer.db import DatabaseRefused, check_database

    try:
        check_database(settings.sqlalchemy_url)
    except DatabaseRefused as exc:
        typer.secho(f"error: {exc.message}", fg=typer.colors.RED, err=True)
        raise typer.Exit(EXIT_ERROR) from exc


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
        ctx: typer.Context,
        host: Annotated[str | None, typer.Option(help="Address to bind (default: CNCLIP_HOST, 127.0.0.1).")] = None,
        port: Annotated[
            int | None, typer.Option(min=0, max=65535, help="Port to bind (default: CNCLIP_PORT, 8000).")
        ] = None,
        log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    ) -> None:
        """Serve the REST API and the web UI (binds the port, then loads the model and warms every
        bucket before answering)."""
        import faiss

        from api.app import create_app
        from api.slow_clients import server_protocol

        # One request = one small FAISS search; the server runs many of them at once on its worker
        # threads. FAISS's own OpenMP threads per search only spin against each other (measured on
        # a busy 2-core host: 27 ms -> 0.1 ms per search of a small collection with one thread).
        faiss.omp_set_num_threads(1)

        settings = load_settings()
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
        exit_on_unusable_vector_store(settings)
        listener = bind_listener(settings.host, settings.port)  # before the model loads
        configure_logging(project_log_level(ctx, log_level), SERVER_FORMAT)
        typer.echo(f"cnclip: model {settings.model_dir}, data {settings.data_dir}")
        run_server(
            create_app(settings),
            listener,
            log_level=log_level,
            # The encoder's batcher merges concurrent requests; one process owns the model and the index.
            workers=1,
            timeout_graceful_shutdown=10,
            # Longer than clients' and proxies' idle pools (httpx: 5 s), so that the server never closes
            # a kept-alive connection just as a client sends on it (a reset, not a retry, for a POST).
            timeout_keep_alive=30,
            # Slow or endless request heads and bodies close the connection (see api/slow_clients.py).
            http=server_protocol(settings),
        )
