"""The `cnclip` commands of the service's layers. Each package registers its own commands; heavy
imports stay inside them so that `cnclip --help` is instant and serving never imports torch."""

from __future__ import annotations

import typer


def build_cli() -> typer.Typer:
    """The commands of the model runtime, the catalog and the server. The `cnclip` program is this
    plus `cnclip demo` (demo/cli.py, the outermost layer: it may import api, api may not import it)."""
    from api import serve_cli, triton_cli
    from indexer import cli as indexer_cli
    from retrieval import cli as retrieval_cli
    from retrieval.convert import cli as convert_cli

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

    # In the order their commands appear in --help; each module imports its heavy parts inside commands.
    for module in (retrieval_cli, convert_cli, indexer_cli, serve_cli, triton_cli):
        module.register(app)
    return app
