"""`cnclip models list` and `cnclip models pull NAME`: the official Chinese-CLIP checkpoints
(retrieval/toolchain/convert/pull.py downloads them), with a download bar on stderr."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from cli.errors import fail
from cli.output import plain_columns
from cli.output_paths import check_output_file, check_output_folder
from retrieval.config import RuntimeSettings
from retrieval.errors import CnclipError, InvalidInput
from retrieval.toolchain.convert.pull import CHECKPOINTS, DownloadError, checkpoint_url, download, file_sha256

models_app = typer.Typer(help="Official Chinese-CLIP checkpoints.", no_args_is_help=True)


@models_app.command("list")
def list_models(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """List the checkpoints `cnclip models pull` knows, with their download URLs (never cut)."""
    base = RuntimeSettings.model_validate({}).model_base_url
    rows = [{"name": c.name, "size": c.size_hint, "url": checkpoint_url(c, base)} for c in CHECKPOINTS.values()]
    if as_json:
        typer.echo(json.dumps({"models": rows}))
        return
    for line in plain_columns(("name", "size", "url"), [list(row.values()) for row in rows]):
        typer.echo(line)


@models_app.command("pull")
def pull(
    name: Annotated[str, typer.Argument(help=f"One of: {', '.join(CHECKPOINTS)}.")],
    dir: Annotated[  # noqa: A002 - the option is called --dir
        Path | None, typer.Option("--dir", help="Download directory (default: <data dir>/checkpoints).")
    ] = None,
    sha256: Annotated[str | None, typer.Option(help="Expected sha256, when the server does not state it.")] = None,
) -> None:
    """Download an official checkpoint (resumable, size and sha256 checked), then print the convert command."""
    console = Console()
    try:
        if name not in CHECKPOINTS:
            raise InvalidInput(f"unknown model {name!r}; choose one of {', '.join(CHECKPOINTS)}")
        settings = RuntimeSettings.model_validate({})
        checkpoint = CHECKPOINTS[name]
        target = (dir or settings.data_dir / "checkpoints") / checkpoint.file
        if target.is_file():
            if sha256 and file_sha256(target) != sha256.lower():
                raise DownloadError(f"{target} exists but its sha256 differs from --sha256; delete it and pull again")
            console.print(f"already downloaded: {target}")
        else:
            check_output_folder(target.parent, "--dir")  # before the download
            check_output_file(target, "--dir")
            url = checkpoint_url(checkpoint, settings.model_base_url)
            console.print(f"downloading {url}")
            with download_bar(target.name) as progress:
                download(url, target, sha256, progress)
            console.print(f"[green]saved[/green] {target}")
    except CnclipError as exc:
        raise fail(exc) from exc
    console.print(f"next: cnclip convert --arch {name} --checkpoint {target} --out models/{name.lower()}")


@contextmanager
def download_bar(label: str) -> Iterator[Callable[[int, int | None], None]]:
    """A transient download bar on stderr; yields `update(done, total)`."""
    bar = Progress(
        TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), transient=True,
    )  # fmt: skip
    task = bar.add_task("download", total=None)
    with bar:
        yield lambda done, total: bar.update(task, completed=done, total=total)


def register(app: typer.Typer) -> None:
    """`cnclip models …`."""
    app.add_typer(models_app, name="models")
