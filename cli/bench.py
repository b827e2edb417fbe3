"""`cnclip bench encoders`: the encoder benchmark of the toolchain (retrieval/toolchain/bench.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cli.errors import fail
from cli.output_paths import check_output_file, write_text_atomically

bench_app = typer.Typer(help="Benchmarks of the model runtime.", no_args_is_help=True)


def ints(value: str) -> list[int]:
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
    from retrieval.config import RuntimeSettings
    from retrieval.errors import CnclipError
    from retrieval.toolchain.bench import TABLE_HEADER, run_sweep, to_json

    tower_list = [t.strip() for t in towers.split(",") if t.strip()]
    if not tower_list or any(t not in ("text", "image") for t in tower_list):
        raise typer.BadParameter("towers must be text and/or image")
    if precision not in ("auto", "fp32", "fp16", "int8"):
        raise typer.BadParameter("precision must be auto, fp32, fp16 or int8")
    if json_out is not None:
        check_output_file(json_out, "--json")  # before the sweep
    base = RuntimeSettings(model_dir=model, precision=precision, buckets=ints(buckets))  # type: ignore[call-arg, arg-type]
    try:
        points = run_sweep(
            model, tower_list, ints(concurrency), _configs(configs), duration, base,
            on_point=lambda p: typer.echo(f"measured: {p.row()}", err=True),
        )  # fmt: skip
    except CnclipError as exc:
        raise fail(exc) from exc
    typer.echo(TABLE_HEADER)
    for point in points:
        typer.echo(point.row())
    if json_out is not None:
        write_text_atomically(json_out, json.dumps(to_json(points), indent=2) + "\n", "--json")


def register(app: typer.Typer) -> None:
    """`cnclip bench …`."""
    app.add_typer(bench_app, name="bench")
