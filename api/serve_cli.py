"""CLI commands of this package (see api/cli.py): `cnclip serve`."""

from __future__ import annotations

import ipaddress
from typing import Annotated

import typer


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
        import uvicorn

        from api.app import create_app
        from retrieval.config import Settings

        overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
        settings = Settings(**overrides)
        if settings.api_key is None and not _is_loopback(settings.host):
            typer.secho(
                f"warning: serving on {settings.host} without CNCLIP_API_KEY: anyone who can reach it can write",
                fg=typer.colors.YELLOW,
                err=True,
            )
        typer.echo(f"cnclip: model {settings.model_dir}, data {settings.data_dir}")
        uvicorn.run(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_level=log_level,
            # The encoder's batcher merges concurrent requests; one process owns the model and the index.
            workers=1,
            timeout_graceful_shutdown=10,
        )
