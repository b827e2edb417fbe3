"""The `cnclip` commands of the service's layers. Each package registers its own commands; heavy
imports stay inside them so that `cnclip --help` is instant and serving never imports torch."""

from __future__ import annotations

import typer

EXIT_INTERRUPTED = 130  # Ctrl-C anywhere (the shell's 128 + SIGINT)
# The README's "Exit status" list says the same.
EXIT_STATUS = (
    "Exit status: 0 all good; 1 an error (the message says which); 2 a usage error (bad option or "
    "argument); 3 some files could not be indexed (the others were); 130 interrupted (Ctrl-C)."
)


def build_cli() -> typer.Typer:
    """The commands of the model runtime, the catalog and the server. The `cnclip` program is this
    plus `cnclip demo` (demo/cli.py, the outermost layer: it may import api, api may not import it)."""
    from api import serve_cli, triton_cli, worker_cli
    from indexer import cli as indexer_cli
    from retrieval import cli as retrieval_cli
    from retrieval.convert import cli as convert_cli

    app = typer.Typer(
        name="cnclip",
        help="Self-hosted cross-modal search for Chinese CLIP.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        # Plain help: Rich's tables print a type for every option (flags included, as `<bool>`).
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
        epilog=EXIT_STATUS,
    )

    def print_version(value: bool) -> None:
        if value:
            typer.echo(installed_version())
            raise typer.Exit()

    @app.callback()
    def main_options(
        version: bool = typer.Option(
            False, "--version", "-V", callback=print_version, is_eager=True, help="Print the version and exit."
        ),
        verbose: int = typer.Option(
            0,
            "--verbose",
            "-v",
            count=True,
            show_default=False,
            help="Log more on stderr: -v info (the model loading), -vv debug.",
        ),
    ) -> None:
        """Self-hosted cross-modal search for Chinese CLIP."""
        from api.cli_logging import configure_logging, verbosity_level

        # Before any command runs: its chatter stays off stderr unless asked for (api/cli_logging.py).
        configure_logging(verbosity_level(verbose))

    @app.command()
    def version() -> None:
        """Print the installed version."""
        typer.echo(installed_version())

    # In the order their commands appear in --help; each module imports its heavy parts inside commands.
    for module in (retrieval_cli, convert_cli, indexer_cli, serve_cli, worker_cli, triton_cli):
        module.register(app)
    return app


def installed_version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("cnclip-search")
