"""`cnclip tune`: measure this machine and write the tuning file the encoder uses (retrieval/toolchain/tune/tuner.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.bench import ints
from cli.errors import fail, sigterm_unwinds
from cli.output_paths import check_output_file

Rounds = Annotated[
    int,
    typer.Option(
        min=2, max=100, help="Passes over every configuration (one open at a time, order alternating); medians."
    ),
]
Seconds = Annotated[
    float, typer.Option(min=0.0, help="Seconds per configuration, shape and pass (longer while calls vary).")
]
ValidateSeconds = Annotated[
    float,
    typer.Option(
        min=0.0,
        help="Seconds per tower, concurrency (1, 8) and pass to check the choice against the defaults "
        "as serve runs them (a cnclip worker each, over HTTP, one at a time); 0 skips the check.",
    ),
]
AcceptNoise = Annotated[
    bool,
    typer.Option(
        "--accept-noise",
        help="Write the file trusted even when other work competed for the CPUs (warned all the same).",
    ),
]


def tune(
    model: Annotated[Path, typer.Option("--model", help="Model directory with manifest.json.")],
    out: Annotated[
        Path | None,
        typer.Option(help="Where to write the tuning file (default MODEL/tuning.json); see CNCLIP_TUNING_FILE."),
    ] = None,
    rounds: Rounds = 2,
    seconds: Seconds = 0.5,
    time_limit: Annotated[
        float, typer.Option(min=1.0, help="Seconds per measurement (repeated once if noisy); fewer passes past it.")
    ] = 900.0,
    backend: Annotated[str, typer.Option(help="Comma-separated backends to try (default: every usable one).")] = "",
    objective: Annotated[str, typer.Option(help="latency (one stream) or throughput (measures streams).")] = "latency",
    memory_budget_mb: Annotated[
        str,
        typer.Option(help="Bound for the weight copies: auto (one copy of each tower + 400 MB), MB, or 0 (none)."),
    ] = "auto",
    buckets: Annotated[str, typer.Option(help="Comma-separated batch buckets (default: all the model has).")] = "",
    validate_seconds: ValidateSeconds = 2.0,
    accept_noise: AcceptNoise = False,
) -> None:
    """Measure every usable backend × precision (that passes the quality gate) × prepacked/shared weights
    per tower and bucket on this machine; print the table; write the choice with the machine's fingerprint."""
    from rich.console import Console
    from rich.progress import Progress

    from retrieval.errors import CnclipError
    from retrieval.memory_budget import parse_budget
    from retrieval.toolchain.tune.report import tune_and_write
    from retrieval.toolchain.tune.tuner import TuneOptions
    from retrieval.tuning import TUNING_NAME

    if out is not None or model.is_dir():  # before minutes of measuring (a missing --model is said below)
        check_output_file(out if out is not None else model / TUNING_NAME, "--out")
    try:
        budget = parse_budget(memory_budget_mb)
    except CnclipError as exc:  # a usage error: exit 2, like typer's own checks
        raise typer.BadParameter(str(exc), param_hint="--memory-budget-mb") from exc
    options = TuneOptions(
        rounds=rounds,
        seconds=seconds,
        time_limit=time_limit,
        backends=[b.strip() for b in backend.split(",") if b.strip()],
        objective=objective,
        memory_budget_mb=budget,
        buckets=ints(buckets) if buckets else (),
        validate_seconds=validate_seconds,
        accept_noise=accept_noise,
    )
    with sigterm_unwinds("cnclip tune"), Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("tuning", total=1)

        def progress(what: str, done: int, total: int) -> None:
            bar.update(task, description=what[:70], completed=done, total=max(total, 1))

        try:
            tune_and_write(model, out, options, progress, typer.echo, lambda line: typer.echo(line, err=True))
        except CnclipError as exc:
            bar.stop()
            raise fail(exc) from exc


def register(app: typer.Typer) -> None:
    """`cnclip tune`."""
    app.command("tune")(tune)
