"""The `cnclip` command. Each package registers its own commands; heavy imports stay inside them
so that `cnclip --help` is instant and serving never imports torch."""

from __future__ import annotations

import importlib

import typer

# Modules with a `register(app)` function, in the order their commands appear in --help.
COMMAND_MODULES = (
    "retrieval.cli",  # bench encoders
    "retrieval.convert.cli",  # convert, models pull
    "indexer.cli",  # db upgrade, index, index-texts, stats, search
    "api.serve_cli",  # serve
    "api.worker_cli",  # worker
    "api.triton_cli",  # export-triton
    "demo.cli",  # demo
)


def build_cli() -> typer.Typer:
    app = typer.Typer(
        name="cnclip",
        help="Self-hosted cross-modal search for Chinese CLIP.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
    )

    @app.command()
    def version() -> None:
        """Print the installed version."""
        from importlib.metadata import version as dist_version

        typer.echo(dist_version("cnclip-search"))

    for module in COMMAND_MODULES:
        importlib.import_module(module).register(app)
    return app


def main() -> None:
    build_cli()()
