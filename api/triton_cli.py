"""CLI commands of this package (see api/cli.py): `cnclip export-triton`, `cnclip triton-server`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def _device_ids(value: str | None) -> tuple[int, ...]:
    if not value:
        return ()
    try:
        ids = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated device numbers such as 0,1, got '{value}'") from None
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise typer.BadParameter(f"device ids must be distinct non-negative numbers, got '{value}'")
    return ids


def register(app: typer.Typer) -> None:
    """Add this package's commands to the `cnclip` app."""
    register_export(app)
    register_server(app)


def register_export(app: typer.Typer) -> None:
    @app.command("export-triton")
    def export_triton(
        model: Annotated[Path, typer.Option("--model", help="Model directory with manifest.json.")],
        out: Annotated[Path, typer.Option("--out", help="Triton model repository to write.")],
        backend: Annotated[
            str,
            typer.Option(
                help="onnxruntime (CPU/GPU, dynamic batching), python (ONNX Runtime inside Triton's Python "
                "backend: CPU, CUDA or CANN, dynamic batching) or npu_ge (Ascend ge-backend, static)."
            ),
        ] = "onnxruntime",
        instances: Annotated[int, typer.Option(help="instance_group count: parallel instances (npu_ge: streams).")] = 1,
        max_batch: Annotated[
            int | None, typer.Option(help="onnxruntime/python: max_batch_size; npu_ge: the bucket of the static graph.")
        ] = None,
        aicore: Annotated[
            str | None, typer.Option(help="npu_ge: cube|vector AI cores per stream (ge.aicoreNum), e.g. 12|10.")
        ] = None,
        device_ids: Annotated[str | None, typer.Option(help="Devices to place instances on, e.g. 0,1.")] = None,
        precision: Annotated[
            str | None, typer.Option(help="fp32 | fp16 | int8 graphs; default fp16 for npu_ge when present, else fp32.")
        ] = None,
        queue_delay_us: Annotated[int, typer.Option(help="dynamic_batching max_queue_delay_microseconds.")] = 4000,
        force: Annotated[bool, typer.Option(help="Replace a non-empty --out.")] = False,
    ) -> None:
        """Write a Triton model repository: cnclip_text, cnclip_image, a Python preprocess model and the
        cnclip_image_bytes ensemble (raw JPEG/PNG in, features out)."""
        from retrieval.errors import CnclipError
        from retrieval.triton_export import BACKENDS, ExportOptions, export_triton_repository

        if backend not in BACKENDS:
            raise typer.BadParameter(f"--backend must be one of {', '.join(BACKENDS)}, got '{backend}'")
        options = ExportOptions(
            backend=backend,  # type: ignore[arg-type]
            instances=instances,
            max_batch=max_batch,
            aicore=aicore,
            device_ids=_device_ids(device_ids),
            precision=precision,
            queue_delay_us=queue_delay_us,
        )
        try:
            report = export_triton_repository(model, out, options, force=force)
        except CnclipError as exc:
            typer.echo(f"error: {exc.message}", err=True)
            raise typer.Exit(1) from None
        for model_name, batch in report.batch.items():
            kind = "static batch" if backend == "npu_ge" else "max_batch_size"
            typer.echo(f"{model_name:16s}  {kind} {batch}  (from bucket graph b{report.source_bucket[model_name]})")
        typer.echo(f"wrote {', '.join(report.models)} to {report.repository}")
        typer.echo(serve_hint(backend, report.repository))


def serve_hint(backend: str, repository: Path) -> str:
    """How to serve a repository of `backend`: a command that works for the one the wheel can run."""
    if backend == "python":
        return f"serve it with: cnclip triton-server {repository}"
    where = "NVIDIA's Triton image (nvcr.io/nvidia/tritonserver)" if backend == "onnxruntime" else "Ascend's ge-backend"
    return (
        f"serve it with a Triton built with {where}: tritonserver --model-repository {repository}\n"
        "(its Python backend imports numpy and Pillow for the preprocess model; "
        "`cnclip triton-server` serves only --backend python exports)"
    )


def _port(value: int, flag: str, *, off: bool) -> int:
    low = 0 if off else 1
    if not low <= value <= 65535:
        raise typer.BadParameter(f"{flag} must be {low}..65535{' (0: off)' if off else ''}, got {value}")
    return value


def register_server(app: typer.Typer) -> None:
    @app.command(
        "triton-server",
        # What follows `--` goes to tritonserver; an unknown option before it is a usage error (a typo).
        context_settings={"allow_extra_args": True},
    )
    def triton_server(
        ctx: typer.Context,
        repository: Annotated[
            Path, typer.Argument(metavar="REPO", help="A repository from `cnclip export-triton --backend python`.")
        ],
        host: Annotated[str, typer.Option(help="Address to bind HTTP, gRPC and metrics to.")] = "127.0.0.1",
        http_port: Annotated[int, typer.Option(help="HTTP (KServe v2) port.")] = 8000,
        grpc_port: Annotated[int, typer.Option(help="gRPC port; 0 turns gRPC off.")] = 8001,
        metrics_port: Annotated[int, typer.Option(help="Prometheus metrics port; 0 (default) turns metrics off.")] = 0,
        ready_timeout: Annotated[float, typer.Option(help="Seconds to wait for every model to load.")] = 600.0,
    ) -> None:
        """Run the tritonserver of the nvidia-pytriton wheel (Triton 2.51, Python backend) on REPO,
        with everything its Python backend needs from this Python, venv or not. Arguments after `--` go
        to tritonserver as they are. Stops cleanly on Ctrl-C or SIGTERM."""
        from api.triton_server import TritonLaunch, TritonServerError, run_until_stopped

        launch = TritonLaunch(
            repository=repository,
            host=host,
            http_port=_port(http_port, "--http-port", off=False),
            grpc_port=_port(grpc_port, "--grpc-port", off=True),
            metrics_port=_port(metrics_port, "--metrics-port", off=True),
            extra_args=tuple(ctx.args),
        )
        if ready_timeout <= 0:
            raise typer.BadParameter(f"--ready-timeout must be positive, got {ready_timeout:g}")
        try:
            status = run_until_stopped(launch, ready_timeout_s=ready_timeout, echo=typer.echo)
        except TritonServerError as exc:
            typer.echo(f"error: {exc.message}", err=True)
            raise typer.Exit(1) from None
        raise typer.Exit(status)
