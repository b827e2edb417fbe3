"""CLI commands of this package (see api/cli.py): `cnclip worker`."""

from __future__ import annotations

from typing import Annotated

import typer

DEFAULT_PORT = 8001  # next to `cnclip serve`'s 8000, so that both run on one host without flags


def register(app: typer.Typer) -> None:
    """Add this package's commands to the `cnclip` app."""

    @app.command()
    def worker(
        ctx: typer.Context,
        host: Annotated[str | None, typer.Option(help="Address to bind (default: CNCLIP_HOST, 127.0.0.1).")] = None,
        port: Annotated[int, typer.Option(min=0, max=65535, help="Port to bind.")] = DEFAULT_PORT,
        log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    ) -> None:
        """Serve only the model: the KServe v2 / Triton protocol (/v2), /healthz, /readyz, /metrics.
        API nodes embed through it with CNCLIP_ENCODER=triton://HOST:PORT. The port is bound before
        the model loads."""
        from api.cli_logging import SERVER_FORMAT, configure_logging
        from api.serve_cli import bind_listener, exit_on_bad_model, load_settings, project_log_level, run_server
        from api.slow_clients import server_protocol
        from api.worker import create_worker_app

        settings = load_settings()
        if host is not None:
            settings = settings.model_copy(update={"host": host})
        exit_on_bad_model(settings.model_copy(update={"encoder": "local"}))  # the worker always runs the model
        listener = bind_listener(settings.host, port)  # before the model loads
        configure_logging(project_log_level(ctx, log_level), SERVER_FORMAT)
        typer.echo(f"cnclip worker: model {settings.model_dir}, /v2 on http://{settings.host}:{port}")
        run_server(
            create_worker_app(settings),
            listener,
            log_level=log_level,
            workers=1,  # one process owns the model; its batcher merges concurrent requests
            timeout_graceful_shutdown=10,
            timeout_keep_alive=30,  # longer than clients' idle pools (see `cnclip serve`)
            http=server_protocol(settings),  # slow or endless heads and bodies close the connection
        )
