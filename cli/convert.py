"""`cnclip convert`: a checkpoint into a model directory of static ONNX graphs (the conversion of the
toolchain, retrieval/toolchain/convert/).

Torch and the exporters are imported inside the commands, so `cnclip --help` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from cli.convert_report import print_report
from cli.errors import fail
from cli.output_paths import check_output_folder
from retrieval.errors import CnclipError, InvalidInput
from retrieval.toolchain.convert import ARCH_NAMES

if TYPE_CHECKING:
    from retrieval.manifest import ModelManifest
    from retrieval.toolchain.convert.report import ConvertReport


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise InvalidInput(f"{what} must be comma-separated integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise InvalidInput(f"{what} must be positive integers, got {text!r}")
    return values


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
    """Convert a CN-CLIP checkpoint into a model directory of static-shape ONNX graphs: both towers per
    batch bucket, simplified, in each precision, checked against PyTorch; manifest + convert-report.json."""
    check_output_folder(out, "--out")  # a usage error (exit 2) before minutes of export
    console = Console()
    try:
        _check_arch(arch, bool(from_cnclip_onnx))
        bucket_list = _int_list(buckets, "--buckets")
        length_list = _int_list(text_lengths, "--text-lengths")
        precisions = [p.strip() for p in precision.split(",") if p.strip()]
        if from_cnclip_onnx:
            manifest, report = _wrap_cnclip_onnx(console, from_cnclip_onnx, out, bucket_list, name, arch, logit_scale)
        else:
            calibration = (calibration_images, calibration_texts)
            manifest, report = _convert_checkpoint(
                console, out, arch, config, checkpoint, random_init, bucket_list, precisions, name, seed, length_list,
                calibration,
            )  # fmt: skip
    except CnclipError as exc:
        raise fail(exc) from exc
    print_report(report, console)
    console.print(f"[green]wrote[/green] {out} (model {manifest.name}, logit_scale {manifest.logit_scale:g})")


def _check_arch(arch: str | None, wrapping: bool) -> None:
    """An unknown `--arch` is named first, before the checkpoint is looked for or torch is imported
    (with `--from-cnclip-onnx` it is only a label)."""
    if arch is not None and not wrapping and arch not in ARCH_NAMES:
        raise InvalidInput(f"unknown architecture {arch!r} (--arch); choose one of {', '.join(ARCH_NAMES)}")


def _wrap_cnclip_onnx(
    console: Console,
    prefix: str,
    out: Path,
    buckets: list[int],
    name: str | None,
    arch: str | None,
    logit_scale: float,
) -> tuple[ModelManifest, ConvertReport]:
    from retrieval.toolchain.convert.cnclip_onnx import wrap_cnclip_onnx

    with console.status("wrapping Chinese-CLIP ONNX graphs") as status:
        return wrap_cnclip_onnx(
            prefix,
            out,
            buckets,
            name=name,
            arch=arch or "cnclip-onnx",
            logit_scale=logit_scale,
            progress=lambda msg: status.update(msg),
        )


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
    calibration: tuple[Path | None, Path | None],
) -> tuple[ModelManifest, ConvertReport]:
    from retrieval.toolchain.convert.checkpoint import model_from_options
    from retrieval.toolchain.convert.openvino_int8 import Calibration
    from retrieval.toolchain.convert.pipeline import convert_model

    model, arch_name, source = model_from_options(arch, config_path, checkpoint, random_init, seed)
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
            calibration=Calibration(*calibration),
        )


def register(app: typer.Typer) -> None:
    """`cnclip convert`."""
    app.command("convert")(convert)
