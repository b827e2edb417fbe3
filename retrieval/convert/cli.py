"""CLI commands of this package (see api/cli.py): `cnclip convert` and `cnclip models pull`.

Torch and the exporters are imported inside the commands, so `cnclip --help` stays instant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from retrieval.errors import CnclipError, InvalidInput

ARCH_NAMES = ("RN50", "ViT-B-16", "ViT-L-14", "ViT-L-14-336", "ViT-H-14")


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise InvalidInput(f"{what} must be comma-separated integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise InvalidInput(f"{what} must be positive integers, got {text!r}")
    return values


def _fail(console: Console, exc: CnclipError) -> typer.Exit:
    console.print(f"[red]error:[/red] {exc.message}", soft_wrap=True)
    return typer.Exit(1)


def convert(
    out: Annotated[Path, typer.Option("--out", help="Model directory to write.")],
    arch: Annotated[str | None, typer.Option(help=f"Released architecture: {', '.join(ARCH_NAMES)}.")] = None,
    config: Annotated[
        Path | None, typer.Option(help="Custom architecture: JSON in cn_clip's merged vision+text config keys.")
    ] = None,
    checkpoint: Annotated[
        Path | None, typer.Option(help="Chinese-CLIP checkpoint (.pt, {'state_dict': ...}); read weights-only.")
    ] = None,
    random_init: Annotated[bool, typer.Option(help="Random weights instead of a checkpoint (benchmarks).")] = False,
    from_cnclip_onnx: Annotated[
        str | None,
        typer.Option(help="Wrap Chinese-CLIP exporter graphs PREFIX.img.fp16.onnx / PREFIX.txt.fp32.onnx / ..."),
    ] = None,
    buckets: Annotated[str, typer.Option(help="Batch sizes, one fixed-shape graph each.")] = "1,4,8,16,32",
    text_lengths: Annotated[
        str,
        typer.Option(help="Text sequence lengths, a text graph per length and batch; 52 is always made."),
    ] = "16,32,52",
    precision: Annotated[
        str,
        typer.Option(help="Comma-separated: fp32, fp16, int8 (ONNX Runtime), int8-qdq (OpenVINO, NNCF-calibrated)."),
    ] = "fp32,fp16,int8",
    calibration_images: Annotated[
        Path | None,
        typer.Option(help="int8-qdq: a folder of pictures like those you will index (default: synthetic ones)."),
    ] = None,
    calibration_texts: Annotated[
        Path | None, typer.Option(help="int8-qdq: a UTF-8 file of texts, one per line (default: built-in captions).")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Model name in the manifest (default cnclip-<arch>).")] = None,
    logit_scale: Annotated[
        float, typer.Option(help="Logit multiplier for --from-cnclip-onnx (graphs do not carry it).")
    ] = 100.0,
    seed: Annotated[int, typer.Option(help="Seed for --random-init.")] = 0,
) -> None:
    """Convert a CN-CLIP checkpoint into a model directory of static-shape ONNX graphs (fp32/fp16/int8).

    Exports image and text towers per batch bucket, simplifies them (op-count report), makes the
    requested precisions, checks every graph against PyTorch, and writes manifest.json +
    convert-report.json.
    """
    console = Console()
    try:
        bucket_list = _int_list(buckets, "--buckets")
        length_list = _int_list(text_lengths, "--text-lengths")
        precisions = [p.strip() for p in precision.split(",") if p.strip()]
        if from_cnclip_onnx:
            from retrieval.convert.cnclip_onnx import wrap_cnclip_onnx

            with console.status("wrapping Chinese-CLIP ONNX graphs") as status:
                manifest, report = wrap_cnclip_onnx(
                    from_cnclip_onnx,
                    out,
                    bucket_list,
                    name=name,
                    arch=arch or "cnclip-onnx",
                    logit_scale=logit_scale,
                    progress=lambda msg: status.update(msg),
                )
        else:
            from retrieval.convert.openvino_int8 import Calibration

            calibration = Calibration(calibration_images, calibration_texts)
            manifest, report = _convert_checkpoint(
                console, out, arch, config, checkpoint, random_init, bucket_list, precisions, name, seed, length_list,
                calibration,
            )  # fmt: skip
    except CnclipError as exc:
        raise _fail(console, exc) from exc
    report.print(console)
    console.print(f"[green]wrote[/green] {out} (model {manifest.name}, logit_scale {manifest.logit_scale:g})")


def _convert_checkpoint(
    console: Console,
    out: Path,
    arch: str | None,
    config_path: Path | None,
    checkpoint: Path | None,
    random_init: bool,
    buckets: list[int],
    precisions: list[str],
    name: str | None,
    seed: int,
    text_lengths: list[int],
    calibration: Any = None,
):  # type: ignore[no-untyped-def]
    import torch

    from retrieval.convert.checkpoint import build_model, load_checkpoint, vary_constant_parameters
    from retrieval.convert.model import architecture_config
    from retrieval.convert.pipeline import convert_model

    if (checkpoint is None) == (not random_init):
        raise InvalidInput("give exactly one of --checkpoint FILE.pt or --random-init (or --from-cnclip-onnx PREFIX)")
    if arch and config_path:
        raise InvalidInput("give --arch or --config, not both")
    embedded, state = load_checkpoint(checkpoint) if checkpoint else (None, None)
    if config_path:
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise InvalidInput(f"cannot read --config {config_path}: {exc}") from exc
        arch_name = config_path.stem
    elif arch:
        try:
            config = architecture_config(arch)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from exc
        arch_name = arch
    elif embedded is not None:
        config, arch_name = embedded, str(embedded.get("name", "custom"))
    else:
        raise InvalidInput(f"give --arch ({', '.join(ARCH_NAMES)}) or --config FILE.json")
    torch.manual_seed(seed)
    model = build_model(config, state)
    if random_init:
        vary_constant_parameters(model)
    source = {"checkpoint": checkpoint.name if checkpoint else None, "random_init": random_init}
    with console.status("converting") as status:
        return convert_model(
            model,
            out,
            arch_name,
            buckets,
            precisions,
            name=name,
            source=source,
            progress=status.update,
            text_lengths=text_lengths,
            calibration=calibration,
        )


def register(app: typer.Typer) -> None:
    """Add this package's commands to the `cnclip` app."""
    app.command("convert")(convert)
    from retrieval.convert.pull import register_models

    register_models(app)
