"""The `cnclip` program: its global options and every command group, in the order `--help` lists
them. Heavy imports stay inside the commands, so that `cnclip --help` is instant and serving never
imports torch."""

from __future__ import annotations

import sys

import typer

from cli import bench, catalog, convert, demo, duplicates, indexing, migrate, models, serving, triton, tune
from cli.errors import EXIT_INTERRUPTED, EXIT_STATUS


def build_cli() -> typer.Typer:
    """The whole `cnclip` command."""
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
        from cli.log_setup import configure_logging, verbosity_level

        # Before any command runs: its chatter stays off stderr unless asked for (cli/log_setup.py).
        configure_logging(verbosity_level(verbose))

    @app.command()
    def version() -> None:
        """Print the installed version."""
        typer.echo(installed_version())

    # In the order their commands appear in --help; each module imports its heavy parts inside commands.
    for register in (
        bench.register,
        tune.register,
        convert.register,
        models.register,
        catalog.register_db,
        indexing.register,
        catalog.register,
        duplicates.register,
        migrate.register,
        serving.register,
        triton.register,
        demo.register,
    ):
        register(app)
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


if __name__ == "__main__":  # `python3 -m cli.main …` runs the program, as `cnclip …` does
    main()
