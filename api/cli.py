"""The `cnclip` command. Each package registers its own commands; heavy imports stay inside them
so that `cnclip --help` is instant and serving never imports torch."""

from __future__ import annotations

import importlib
import sys

import typer

EXIT_INTERRUPTED = 130  # Ctrl-C anywhere (the shell's 128 + SIGINT)
# The README's "Exit status" list says the same.
EXIT_STATUS = (
    "Exit status: 0 all good; 1 an error (the message says which); 2 a usage error (bad option or "
    "argument); 3 some files could not be indexed (the others were); 130 interrupted (Ctrl-C)."
)

# Modules with a `register(app)` function, in the order their commands appear in --help.
COMMAND_MODULES = (
    "retrieval.cli",  # bench encoders
    "retrieval.convert.cli",  # convert, models pull
    "indexer.cli",  # db upgrade, index, index-texts, stats, search
    "api.serve_cli",  # serve
    "api.triton_cli",  # export-triton
    "demo.cli",  # demo
)


def build_cli() -> typer.Typer:
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
    ) -> None:
        """Self-hosted cross-modal search for Chinese CLIP."""

    @app.command()
    def version() -> None:
        """Print the installed version."""
        typer.echo(installed_version())

    for module in COMMAND_MODULES:
        importlib.import_module(module).register(app)
    return app


def installed_version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("cnclip-search")


def main() -> None:
    """The `cnclip` entry point; Ctrl-C outside a command's own handler exits 130, without a traceback."""
    try:
        build_cli()()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
