"""What the KServe v2 path costs: the in-process encoder, the same encoder behind our /v2 endpoint,
and a real Triton Inference Server running the same model.

    python benchmarks/bench_kserve.py --model models/cnclip-demo [--repeats 3] [--duration 3]

The servers run in their own processes, so client and server do not share a GIL. Side by side,
interleaved, each `--repeats` times, for texts and for image files:
- `local`: `LocalEncoder` in this process (the baseline);
- `remote`: `TritonEncoder` (tritonclient's aiohttp client, binary tensors) → loopback → our /v2
  (uvicorn, the /v2 router around a LocalEncoder with the same settings);
- `json`: the same request with JSON tensors through tritonclient's plain HTTP client (text only);
- `remote, no-op server`: `remote` against a server whose encoder answers zeros at once, so what
  remains is the protocol's own cost (HTTP, (de)serialisation, the second process);
- `triton (python backend)`: `TritonEncoder` → a real Triton 2.51 (nvidia-pytriton's tritonserver,
  started by `cnclip triton-server`, see tests/support/real_triton.py) serving `cnclip export-triton
  --backend python` of the same model and precision: the batch-dynamic graphs in ONNX Runtime inside Python-backend stubs, Triton's dynamic
  batcher with the buckets as preferred sizes, images decoded by the `preprocess` model of the
  ensemble. `--no-triton` leaves it out (e.g. where nvidia-pytriton cannot run).
Each figure is the median over repeats of items/s and p50 latency at the given concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import io
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from api.config import Settings  # noqa: E402
from retrieval.errors import EncoderUnavailable  # noqa: E402
from retrieval.types import Encoder  # noqa: E402
from tests.support.real_triton import RealTriton  # noqa: E402


def settings_for(model: Path, buckets: list[int], precision: str = "fp32") -> Settings:
    return Settings(
        _env_file=None,
        model_dir=model,
        provider="cpu",
        precision=precision,
        buckets=buckets,
        data_dir=Path("/tmp/bench-kserve"),
        query_cache_size=0,  # the texts repeat: a cache would measure lookups, not the round trips
    )


class NoopEncoder:
    """Answers zeros at once: what is left of a round trip is the protocol's own cost."""

    def __init__(self, settings: Settings) -> None:
        from retrieval.manifest import ModelManifest

        manifest = ModelManifest.load(settings.model_dir, verify=False)
        self.settings, self.dim, self.ready = settings, manifest.embed_dim, True
        self.context_length, self.image_size = manifest.context_length, manifest.image_size

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def embed_token_ids(self, ids: np.ndarray) -> np.ndarray:
        return np.zeros((len(ids), self.dim), np.float32)

    async def embed_images(self, images: list[bytes]) -> np.ndarray:
        return np.zeros((len(images), self.dim), np.float32)


def serve(model: Path, port: int, buckets: list[int], noop: bool, precision: str) -> None:
    """The server process: /v2 around a LocalEncoder (or the no-op encoder)."""
    import uvicorn

    from tests.support.kserve_server import local_encoder, v2_app

    settings = settings_for(model, buckets, precision)
    encoder = NoopEncoder(settings) if noop else local_encoder(settings)
    uvicorn.run(v2_app(encoder), host="127.0.0.1", port=port, log_level="warning")


async def start_remote(settings: Settings, port: int) -> object:
    from retrieval.remote import TritonEncoder

    remote = TritonEncoder(settings, url=f"triton://127.0.0.1:{port}", timeout_s=60, retries=0)
    for _ in range(240):  # wait for the server process to warm up
        try:
            await remote.start()
            return remote
        except EncoderUnavailable:
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the benchmark server on port {port} did not come up")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def images(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    files = []
    for _ in range(n):
        buffer = io.BytesIO()
        Image.fromarray((rng.random((480, 640, 3)) * 255).astype(np.uint8)).save(buffer, format="JPEG", quality=85)
        files.append(buffer.getvalue())
    return files


async def measure(call: Callable[[int], Awaitable[object]], concurrency: int, seconds: float) -> tuple[float, float]:
    """Items/s and p50 latency (ms) of `concurrency` clients calling back to back for `seconds`."""
    latencies: list[float] = []
    end = time.perf_counter() + seconds

    async def client(index: int) -> None:
        i = index
        while time.perf_counter() < end:
            started = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - started)
            i += concurrency

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(concurrency)))
    elapsed = time.perf_counter() - started
    return len(latencies) / elapsed, statistics.median(latencies) * 1000


def json_text_caller(url: str, texts: list[str]) -> Callable[[int], Awaitable[object]]:
    import tritonclient.http as triton_http

    from retrieval.tokenizer import tokenize

    local = threading.local()  # gevent-based clients must stay on the thread that made them

    def infer_json(ids: np.ndarray) -> object:
        if not hasattr(local, "client"):
            local.client = triton_http.InferenceServerClient(url)
        tensor = triton_http.InferInput("text", list(ids.shape), "INT64")
        tensor.set_data_from_numpy(ids, binary_data=False)
        wanted = [triton_http.InferRequestedOutput("text_features", binary_data=False)]
        return local.client.infer("cnclip_text", [tensor], outputs=wanted)

    async def call(i: int) -> object:
        # tritonclient's plain client is blocking (gevent); a thread keeps the event loop free.
        return await asyncio.to_thread(infer_json, tokenize([texts[i % len(texts)]]))

    return call


def start_triton(args: argparse.Namespace, workdir: Path) -> RealTriton:
    """A real Triton serving `export-triton --backend python` of the model (max batch = largest bucket)."""
    from retrieval.toolchain.triton.export import ExportOptions, export_triton_repository

    repository = workdir / "repo"
    options = ExportOptions(backend="python", max_batch=max(args.buckets), precision=args.precision)
    export_triton_repository(args.model, repository, options, force=True)
    return RealTriton(repository, log_path=workdir / "tritonserver.log").start()


async def run(args: argparse.Namespace) -> list[str]:
    import tempfile

    from retrieval.encoder import LocalEncoder

    settings = settings_for(args.model, args.buckets, args.precision)
    port, noop_port = free_port(), free_port()
    common = ["--model", str(args.model), "--precision", args.precision, "--buckets", ",".join(map(str, args.buckets))]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), *common])
    noop_server = subprocess.Popen([sys.executable, __file__, "--serve", str(noop_port), "--noop", *common])
    workdir = Path(tempfile.mkdtemp(prefix="bench-kserve-"))
    triton = None if args.no_triton else start_triton(args, workdir)
    try:
        local = LocalEncoder(settings)
        await local.start()
        remote = await start_remote(settings, port)
        noop = await start_remote(settings, noop_port)
        real = await start_remote(settings, triton.port) if triton is not None else None
        cases = paths(local, remote, noop, real, port)
        results: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
        for _ in range(args.repeats):
            for concurrency in args.concurrency:
                for (tower, path), call in cases.items():  # interleaved: noise hits every path alike
                    await measure(call, concurrency, 0.3)  # warm the path's connections
                    results.setdefault((tower, path, concurrency), []).append(
                        await measure(call, concurrency, args.duration)
                    )
        for encoder in (remote, noop, real, local):
            if encoder is not None:
                await encoder.close()
    finally:
        for process in (server, noop_server):
            process.terminate()
            process.wait(timeout=30)
        if triton is not None:
            triton.close()
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return table(results)


def paths(
    local: Encoder, remote: Encoder, noop: Encoder, real: Encoder | None, port: int
) -> dict[tuple[str, str], Callable[[int], Awaitable[object]]]:
    """(tower, path) -> one call of request `i`: local, through /v2 (binary and JSON), a no-op server, real Triton."""
    texts = [f"第{i}张照片：穿红色裙子的女孩在海边" for i in range(512)]
    files = images(16)
    cases: dict[tuple[str, str], Callable[[int], Awaitable[object]]] = {
        ("text", "local"): lambda i: local.embed_texts([texts[i % len(texts)]]),
        ("text", "remote"): lambda i: remote.embed_texts([texts[i % len(texts)]]),
        ("text", "json"): json_text_caller(f"127.0.0.1:{port}", texts),
        ("text", "remote, no-op server"): lambda i: noop.embed_texts([texts[i % len(texts)]]),
        ("image", "local"): lambda i: local.embed_images([files[i % len(files)]]),
        ("image", "remote"): lambda i: remote.embed_images([files[i % len(files)]]),
        ("image", "remote, no-op server"): lambda i: noop.embed_images([files[i % len(files)]]),
    }
    if real is not None:
        cases[("text", "triton (python backend)")] = lambda i: real.embed_texts([texts[i % len(texts)]])
        cases[("image", "triton (python backend)")] = lambda i: real.embed_images([files[i % len(files)]])
    return cases


def table(results: dict[tuple[str, str, int], list[tuple[float, float]]]) -> list[str]:
    lines = [
        "| tower | concurrency | path | items/s | p50 ms | items/s vs local |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for (tower, path, concurrency), runs in results.items():
        rate = statistics.median(r[0] for r in runs)
        p50 = statistics.median(r[1] for r in runs)
        base = statistics.median(r[0] for r in results[(tower, "local", concurrency)])
        lines.append(f"| {tower} | {concurrency} | {path} | {rate:.1f} | {p50:.1f} | {rate / base:.2f}× |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--concurrency", type=lambda v: [int(x) for x in v.split(",")], default=[1, 8])
    parser.add_argument("--buckets", type=lambda v: [int(x) for x in v.split(",")], default=[1, 4, 8])
    parser.add_argument("--precision", default="fp32", help="graphs of every path (the export's too)")
    parser.add_argument("--no-triton", action="store_true", help="leave the real Triton out")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--noop", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.model, args.serve, args.buckets, args.noop, args.precision)
        return
    started = dt.datetime.now(dt.UTC)
    lines = asyncio.run(run(args))
    cores = len(os.sched_getaffinity(0))
    print(
        f"{started:%Y-%m-%d %H:%M} UTC, {platform.machine()}, {cores} cores, model {args.model}, "
        f"{args.precision}, buckets {args.buckets}"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
