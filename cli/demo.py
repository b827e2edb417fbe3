"""`cnclip demo`: draw and index a demo gallery (demo/gallery.py), then serve the UI."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.errors import fail
from cli.output import plural


def register(app: typer.Typer) -> None:
    """Add this package's commands to the `cnclip` app."""

    @app.command()
    def demo(
        serve: Annotated[bool, typer.Option("--serve/--no-serve", help="Start the server when done.")] = True,
        host: Annotated[str | None, typer.Option(help="Address to bind (default: CNCLIP_HOST, 127.0.0.1).")] = None,
        port: Annotated[
            int | None, typer.Option(min=0, max=65535, help="Port to bind (default: CNCLIP_PORT, 8000).")
        ] = None,
    ) -> None:
        """Generate and index a demo gallery (+ captions for image → text), then serve the UI.

        The pictures and texts go under CNCLIP_DATA_DIR/demo; a second run reuses them and the indexer
        skips what it already has. `--no-serve` does everything but start the server.
        """
        import asyncio

        from api.config import Settings
        from cli.errors import read_settings
        from cli.progress import IndexProgress
        from cli.serving import bind_listener, run_server
        from demo.gallery import IMAGE_COLLECTION, TEXT_COLLECTION, example_commands, index_demo, write_demo_files
        from retrieval.errors import CnclipError

        overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
        settings = read_settings(Settings, **overrides)
        # A busy port fails now, in one line, not after the gallery is drawn and indexed.
        listener = bind_listener(settings.host, settings.port) if serve else None
        typer.echo(f"cnclip demo: model {settings.model_dir}, data {settings.data_dir}")
        try:
            files = write_demo_files(settings)
            typer.echo(f"{'generated' if files.created else 'reusing'} the demo gallery in {files.root}")
            result = asyncio.run(index_demo(settings, files, IndexProgress(IMAGE_COLLECTION)))
        except CnclipError as exc:
            if listener is not None:
                listener.close()
            raise fail(exc) from exc
        for name in result.replaced:
            typer.echo(f"re-indexed {name}: the model has changed since")
        typer.echo(
            f"{IMAGE_COLLECTION}: {plural(result.images_added, 'picture')} indexed, {result.images_skipped} already there"
            + (f", {result.failures} failed" if result.failures else "")
        )
        typer.echo(
            f"{TEXT_COLLECTION}: {plural(result.texts_added, 'text')} added, {result.texts_existing} already there"
        )
        if listener is None:
            # Nothing listens yet: no URLs, only what works now and how to start the server.
            typer.echo("\nNothing is serving (--no-serve). Try it from the shell:")
            typer.echo(f"  cnclip search 红色的星星 --collection {IMAGE_COLLECTION} -k 5")
            typer.echo(f"and start the UI and API with:\n  cnclip serve --host {settings.host} --port {settings.port}")
            return
        typer.echo("\nTry it:")
        for what, command in example_commands(settings, files):
            typer.echo(f"  # {what}\n  {command}")
        from api.app import create_app

        typer.echo(f"\nserving http://{settings.host}:{settings.port}/ (Ctrl-C to stop)")
        run_server(create_app(settings), listener, workers=1, timeout_graceful_shutdown=10)
