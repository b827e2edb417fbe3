"""`cnclip export-triton` (retrieval/toolchain/triton/export.py) and `cnclip triton-server` (the
nvidia-pytriton wheel's tritonserver, retrieval/toolchain/triton/server.py, run until Ctrl-C)."""

from __future__ import annotations

import platform
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.errors import EXIT_INTERRUPTED, fail
from cli.output_paths import check_output_folder

if TYPE_CHECKING:
    from retrieval.toolchain.triton.server import TritonLaunch


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
    """`cnclip export-triton` and `cnclip triton-server`."""
    register_export(app)
    register_server(app)


def register_export(app: typer.Typer) -> None:
    @app.command("export-triton")
    def export_triton(
        model: Annotated[Path, typer.Option("--model", help="Model directory with manifest.json.")],
        out: Annotated[Path, typer.Option("--out", help="Triton model repository to write.")],
        backend: Annotated[
            str,
            typer.Option(help=_backends_help()),
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
        from retrieval.toolchain.triton.backends import triton_backend
        from retrieval.toolchain.triton.export import ExportOptions, export_triton_repository

        try:
            record = triton_backend(backend)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        options = ExportOptions(
            backend=backend,  # type: ignore[arg-type]
            instances=instances,
            max_batch=max_batch,
            aicore=aicore,
            device_ids=_device_ids(device_ids),
            precision=precision,
            queue_delay_us=queue_delay_us,
        )
        check_output_folder(out, "--out")
        try:
            report = export_triton_repository(model, out, options, force=force)
        except CnclipError as exc:
            raise fail(exc) from None
        for model_name, batch in report.batch.items():
            kind = "max_batch_size" if record.dynamic_batching else "static batch"
            typer.echo(f"{model_name:16s}  {kind} {batch}  (from bucket graph b{report.source_bucket[model_name]})")
        typer.echo(f"wrote {', '.join(report.models)} to {report.repository}")
        typer.echo(serve_hint(backend, report.repository))


def serve_hint(backend: str, repository: Path) -> str:
    """How to serve a repository of `backend`: a command that works for the one the wheel can run."""
    from retrieval.toolchain.triton.backends import triton_backend

    return triton_backend(backend).serve_hint.format(repository=repository)


def _backends_help() -> str:
    from retrieval.toolchain.triton.backends import TRITON_BACKENDS

    *rest, last = (record.summary for record in TRITON_BACKENDS.values())
    return f"{', '.join(rest)} or {last}."


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
        from retrieval.toolchain.triton.server import TritonLaunch, TritonServerError

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
            raise fail(exc) from None
        raise typer.Exit(status)


def run_until_stopped(launch: TritonLaunch, *, ready_timeout_s: float, echo: Callable[[str], None]) -> int:
    """`cnclip triton-server`: start, say where it listens once ready, forward SIGINT/SIGTERM, reap.

    The exit status: 130 after Ctrl-C (SIGINT); 0 after a SIGTERM (a service manager's stop) that
    the server obeyed; 1 when the server could not start, was not ready in time, exited by itself or
    did not stop cleanly. A second signal kills the server at once.
    """
    asked: list[int] = []
    from retrieval.toolchain.triton.server import TritonServer, TritonServerError

    server = TritonServer(launch)

    def forward(signum: int, _frame: object) -> None:
        if asked:
            server.kill()  # a second Ctrl-C: do not wait for in-flight requests
        asked.append(signum)
        server.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with server:
            server.start(die_with_parent=True)
            if asked:  # a signal that came while it was starting, before there was a process to forward it to
                server.send_signal(asked[0])
            echo(
                f"tritonserver (nvidia-pytriton) on {launch.repository}: {', '.join(server.models)}; "
                f"Python backend on {sys.executable} ({platform.python_version()})"
            )
            if server.wait_ready(ready_timeout_s, give_up=lambda: bool(asked)):
                echo(_where_it_listens(launch))
            assert server.process is not None
            status = server.process.wait()  # until it stops by itself or a forwarded signal
            if not asked:
                raise TritonServerError(f"tritonserver exited with status {status}")
            if asked[0] == signal.SIGINT:
                return EXIT_INTERRUPTED  # interrupted, however the server took it
            if status != 0:
                raise TritonServerError(f"tritonserver stopped with status {status}")
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _where_it_listens(launch: TritonLaunch) -> str:
    lines = [f"ready: HTTP {launch.http_url} (KServe v2, /v2/health/ready)"]
    if launch.grpc_port:
        lines.append(f"       gRPC {launch.probe_host}:{launch.grpc_port}")
    if launch.metrics_port:
        lines.append(f"       metrics http://{launch.probe_host}:{launch.metrics_port}/metrics")
    lines.append(f"embed through it: CNCLIP_ENCODER=triton://{launch.probe_host}:{launch.http_port}  (Ctrl-C to stop)")
    return "\n".join(lines)
