"""CLI commands of this package (see api/cli.py): `cnclip bench encoders` and `cnclip tune`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

bench_app = typer.Typer(help="Benchmarks of the model runtime.", no_args_is_help=True)


def _ints(value: str) -> list[int]:
    try:
        numbers = [int(v) for v in value.split(",") if v.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"expected comma-separated integers, got {value!r}") from exc
    if not numbers or min(numbers) < 1:
        raise typer.BadParameter("expected positive integers")
    return numbers


def _configs(value: str) -> list[tuple[int, bool]]:
    """'1:on,1:off,2:on' → [(1, True), (1, False), (2, True)]."""
    out = []
    for item in value.split(","):
        streams, _, mode = item.strip().partition(":")
        if not streams.isdigit() or int(streams) < 1 or mode not in ("on", "off"):
            raise typer.BadParameter(f"config {item!r} is not STREAMS:on|off (e.g. 2:on)")
        out.append((int(streams), mode == "on"))
    return out


@bench_app.command("encoders")
def bench_encoders(
    model: Annotated[Path, typer.Option("--model", help="Model directory with manifest.json.")],
    towers: Annotated[str, typer.Option(help="Comma-separated towers to measure.")] = "text,image",
    concurrency: Annotated[str, typer.Option(help="Comma-separated client counts.")] = "1,2,4,8,16",
    configs: Annotated[str, typer.Option(help="STREAMS:on|off (dynamic batcher) pairs.")] = "1:on,1:off,2:on",
    duration: Annotated[float, typer.Option(help="Seconds per measurement point.")] = 5.0,
    precision: Annotated[str, typer.Option(help="auto, fp32, fp16 or int8.")] = "auto",
    buckets: Annotated[str, typer.Option(help="Comma-separated batch buckets.")] = "1,4,8,16,32",
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the points as JSON here.")] = None,
) -> None:
    """Perf-analyzer-style sweep: items/s and p50/p95/p99 latency per tower, concurrency and config."""
    from retrieval.bench import TABLE_HEADER, run_sweep, to_json
    from retrieval.config import RuntimeSettings
    from retrieval.errors import CnclipError

    tower_list = [t.strip() for t in towers.split(",") if t.strip()]
    if not tower_list or any(t not in ("text", "image") for t in tower_list):
        raise typer.BadParameter("towers must be text and/or image")
    if precision not in ("auto", "fp32", "fp16", "int8"):
        raise typer.BadParameter("precision must be auto, fp32, fp16 or int8")
    base = RuntimeSettings(model_dir=model, precision=precision, buckets=_ints(buckets))  # type: ignore[call-arg, arg-type]
    try:
        points = run_sweep(
            model, tower_list, _ints(concurrency), _configs(configs), duration, base,
            on_point=lambda p: typer.echo(f"measured: {p.row()}", err=True),
        )  # fmt: skip
    except CnclipError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(TABLE_HEADER)
    for point in points:
        typer.echo(point.row())
    if json_out is not None:
        json_out.write_text(json.dumps(to_json(points), indent=2) + "\n", encoding="utf-8")


def tune(
    model: Annotated[Path, typer.Option("--model", help="Model directory with manifest.json.")],
    out: Annotated[
        Path | None,
        typer.Option(help="Where to write the tuning file (default MODEL/tuning.json); see CNCLIP_TUNING_FILE."),
    ] = None,
    rounds: Annotated[int, typer.Option(min=1, max=100, help="Interleaved rounds; medians over them.")] = 3,
    seconds: Annotated[float, typer.Option(min=0.0, help="Seconds per configuration, shape and round.")] = 0.5,
    time_limit: Annotated[
        float, typer.Option(min=1.0, help="Seconds for all measurements; fewer rounds or shorter cases past it.")
    ] = 900.0,
    backend: Annotated[str, typer.Option(help="Comma-separated backends to try (default: every usable one).")] = "",
    objective: Annotated[str, typer.Option(help="latency (one stream) or throughput (measures streams).")] = "latency",
    memory_budget_mb: Annotated[int, typer.Option(min=0, help="Bound for the weight copies, MB (0: none).")] = 0,
    buckets: Annotated[str, typer.Option(help="Comma-separated batch buckets (default: all the model has).")] = "",
) -> None:
    """Measure every usable backend × precision (that passes the quality gate) × prepacked/shared weights
    per tower and bucket on this machine; print the table; write the choice with the machine's fingerprint."""
    from rich.console import Console
    from rich.progress import Progress

    from retrieval.errors import CnclipError
    from retrieval.tune import TuneOptions
    from retrieval.tune_report import tune_and_write

    options = TuneOptions(
        rounds=rounds,
        seconds=seconds,
        time_limit=time_limit,
        backends=[b.strip() for b in backend.split(",") if b.strip()],
        objective=objective,
        memory_budget_mb=memory_budget_mb,
        buckets=_ints(buckets) if buckets else (),
    )
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("tuning", total=1)

        def progress(what: str, done: int, total: int) -> None:
            bar.update(task, description=what[:70], completed=done, total=max(total, 1))

        try:
            tune_and_write(model, out, options, progress, typer.echo)
        except CnclipError as exc:
            bar.stop()
            typer.echo(f"error: {exc.message}", err=True)
            raise typer.Exit(1) from exc


def register(app: typer.Typer) -> None:
    """Add this package's commands to the `cnclip` app."""
    app.add_typer(bench_app, name="bench")
    app.command("tune")(tune)
