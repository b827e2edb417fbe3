"""`cnclip serve` and `cnclip worker`: uvicorn on a port bound before the model loads, and everything
that can stop a server checked first, each failure one line and its exit status (cli/errors.py)."""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.errors import EXIT_ERROR, BadSetting, error_line, fail, friendly_errors
from cli.log_setup import SERVER_FORMAT, configure_logging, uvicorn_level, verbosity_level
from retrieval.errors import CnclipError

if TYPE_CHECKING:
    from api.config import Settings
    from retrieval.config import RuntimeSettings

DEFAULT_WORKER_PORT = 8001  # next to `cnclip serve`'s 8000, so that both run on one host without flags
HostOption = Annotated[str | None, typer.Option(help="Address to bind (default: CNCLIP_HOST, 127.0.0.1).")]
LogLevelOption = Annotated[str, typer.Option(help="uvicorn log level.")]


def load_settings() -> Settings:
    """`Settings()` from the environment; a bad value is one line per setting and exit status 2."""
    from api.config import Settings
    from cli.errors import read_settings

    return read_settings(Settings)


def exit_on_bad_model(settings: Settings) -> None:
    """Fail with one line and status 2, not a lifespan traceback, when a local model directory (the
    settings' or one of `CNCLIP_MODEL_DIRS`), its tuning file or its plan cannot be used
    (retrieval/model_check.py)."""
    if settings.encoder != "local":
        return
    for name, directory in [("CNCLIP_MODEL_DIR", settings.model_dir)] + [
        ("CNCLIP_MODEL_DIRS", d) for d in settings.model_dirs
    ]:
        exit_on_bad_model_dir(settings, name, directory)


def exit_on_bad_model_dir(settings: RuntimeSettings, name: str, directory: Any) -> None:
    """One line and status 2 when the model directory `directory` (named by `name`: a setting, an
    option) cannot run with these settings (retrieval/model_check.py)."""
    from retrieval.model_check import check_local_model

    try:
        check_local_model(settings.model_copy(update={"model_dir": directory}))
    except CnclipError as exc:
        said = exc.message if exc.message.startswith("CNCLIP_") else f"{name}: {exc.message}"
        raise fail(BadSetting(said)) from None


def exit_on_missing_watched_folder(settings: Settings) -> None:
    """`CNCLIP_WATCH` naming a folder that is not there: one line and status 2, before the port is bound."""
    from pathlib import Path

    for folder in settings.watch:
        if not Path(folder).is_dir():
            raise fail(BadSetting(f"CNCLIP_WATCH: {folder} is not a folder"))


def exit_on_unwatchable_collection(settings: Settings) -> None:
    """`CNCLIP_WATCH` naming a collection its watcher would refuse (a text collection, another model's):
    one line and status 2, before the port is bound — not a server that starts and never watches."""
    if not settings.watch:
        return
    import asyncio

    from indexer.runtime import open_runtime
    from indexer.service.resolver import check_kind
    from retrieval.errors import NotFound

    local = settings.encoder == "local"  # a remote encoder's model is known once it answers: kind only

    async def check() -> None:
        async with open_runtime(settings, encoder=local, warm=False) as rt:  # the models' ids and sizes, no session
            assert rt.service is not None
            for folder, collection in settings.watch.items():
                try:
                    info = rt.service.get(collection)
                except NotFound:
                    continue  # the watcher creates it
                try:  # what the watcher's `ensure` checks, asked now
                    check_kind(info, "images", "watching a folder")
                    if local:
                        rt.service.check_model(info)
                except CnclipError as exc:
                    raise BadSetting(f"CNCLIP_WATCH: {folder}: {exc.message}") from None

    try:
        asyncio.run(check())
    except BadSetting as exc:
        raise fail(exc) from None


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
    except (OSError, OverflowError, TypeError, UnicodeError) as exc:
        # In use, not an address of this host, a port out of range, a name whose bytes are not UTF-8
        # ("encoding of hostname failed") or that IDNA refuses.
        listener.close()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        shown = host if host.isprintable() and host.isascii() else ascii(host)
        raise fail(CnclipError(f"cannot listen on {shown}:{port}: {reason}")) from None
    return listener


class OneLineStartupFailure:
    """`app`, whose failed start-up is said in one line when a project error stopped it: uvicorn logs
    the traceback Starlette hands it ("lifespan.startup.failed"), which for an error raised on purpose
    (a model that cannot load, a budget nothing fits in) says nothing the message does not. Any other
    exception keeps its traceback: that is a bug to see. Everything else is the app's (`.state`, …)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "lifespan":
            return await self.app(scope, receive, send)

        async def say_one_line(message: dict[str, Any]) -> None:
            error = _project_error(sys.exc_info()[1])  # Starlette sends this from inside its `except`
            if message.get("type") == "lifespan.startup.failed" and error is not None:
                message = {**message, "message": error_line(error)}
            await send(message)

        return await self.app(scope, receive, say_one_line)


def _project_error(exc: BaseException | None) -> CnclipError | None:
    """The project error that `exc` is, or the only one a group of exceptions holds."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, CnclipError) else None


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

    server = Server(uvicorn.Config(OneLineStartupFailure(app), host=host, port=port, **options))
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


def server_options(settings: Settings) -> dict[str, Any]:
    """What `serve` and `worker` tell uvicorn besides the app and the socket."""
    from api.slow_clients import server_protocol

    return {
        "workers": 1,  # one process owns the model; its batcher merges concurrent requests
        "timeout_graceful_shutdown": 10,
        # Longer than clients' and proxies' idle pools (httpx: 5 s), so that the server never closes
        # a kept-alive connection just as a client sends on it (a reset, not a retry, for a POST).
        "timeout_keep_alive": 30,
        # Slow or endless request heads and bodies close the connection (see api/slow_clients.py).
        "http": server_protocol(settings),
    }


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    ctx: typer.Context,
    host: HostOption = None,
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Port to bind (default: CNCLIP_PORT, 8000).")
    ] = None,
    log_level: LogLevelOption = "info",
) -> None:
    """Serve the REST API and the web UI (binds the port, then loads the model and warms every
    bucket before answering)."""
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
    exit_on_missing_watched_folder(settings)
    # Imported once the settings and the model are known good: the app and the storage take ~2 s to
    # import on a small machine, which a bad setting's one line need not wait for.
    from api.app import create_app
    from indexer.runtime import check_storage, prepare_for_serving

    check_storage(settings)  # a SQLite file that is no catalog, a vector engine that cannot be used
    exit_on_unwatchable_collection(settings)
    prepare_for_serving(settings)
    listener = bind_listener(settings.host, settings.port)  # before the model loads
    configure_logging(project_log_level(ctx, log_level), SERVER_FORMAT)
    typer.echo(f"cnclip: model {settings.model_dir}, data {settings.data_dir}")
    run_server(create_app(settings), listener, log_level=log_level, **server_options(settings))


def worker(
    ctx: typer.Context,
    host: HostOption = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to bind.")] = DEFAULT_WORKER_PORT,
    log_level: LogLevelOption = "info",
) -> None:
    """Serve only the model: the KServe v2 / Triton protocol (/v2), /healthz, /readyz, /metrics.
    API nodes embed through it with CNCLIP_ENCODER=triton://HOST:PORT. The port is bound before
    the model loads."""
    from api.worker import create_worker_app

    settings = load_settings()
    if host is not None:
        settings = settings.model_copy(update={"host": host})
    exit_on_bad_model(settings.model_copy(update={"encoder": "local"}))  # the worker always runs the model
    listener = bind_listener(settings.host, port)  # before the model loads
    configure_logging(project_log_level(ctx, log_level), SERVER_FORMAT)
    bound = listener.getsockname()[1]  # `--port 0` binds a free port: say which (`cnclip tune` reads it)
    typer.echo(f"cnclip worker: model {settings.model_dir}, /v2 on http://{settings.host}:{bound}")
    run_server(create_worker_app(settings), listener, log_level=log_level, **server_options(settings))


def register(app: typer.Typer) -> None:
    """`cnclip serve` and `cnclip worker`."""
    app.command()(friendly_errors(serve))
    app.command()(friendly_errors(worker))
