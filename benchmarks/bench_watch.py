"""Watched folders: how long from a photo's file being closed to the photo being searchable in a running
server, measured through the server's HTTP API.

    python benchmarks/bench_watch.py --smoke           # 3 files per mode, the toy model: a quick check
    python benchmarks/bench_watch.py -n 30             # the shipped demo model (or --model DIR)

Two modes, each on its own data dir and folder:
- `serve`: `cnclip serve` with `CNCLIP_WATCH` watching the folder (the server's own watcher writes and
  its vector store is caught up by each commit);
- `external`: `cnclip serve` without a watcher, and `cnclip index FOLDER --watch` beside it (the watcher
  writes SQL; the server sees the collection's version move within `CNCLIP_SYNC_INTERVAL_S`).

Each file is written in one go and closed; the clock starts at the close and stops at the first text
search (polled every 10 ms, k=200) whose results name the file. The quiet period
(`CNCLIP_WATCH_QUIET_S`, `--quiet`) is part of the latency by design: a file is read once it has been
still that long. Files are written one at a time, `--gap` seconds apart.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def photo(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cnclip(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    handle = open(log, "wb")  # noqa: SIM115 - the child writes it until it ends
    return subprocess.Popen([sys.executable, "-m", "cli.main", *args], env=env, stdout=handle, stderr=subprocess.STDOUT)


def names(client: httpx.Client, collection: str) -> set[str]:
    response = client.post("/v1/search/text", json={"query": "照片", "collection": collection, "k": 200})
    return {hit["filename"] for hit in response.json()["results"]} if response.status_code == 200 else set()


def wait_for(client: httpx.Client, collection: str, name: str, timeout: float) -> float:
    started = time.perf_counter()
    while name not in names(client, collection):
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"{name} not searchable after {timeout} s")
        time.sleep(0.01)
    return time.perf_counter() - started


def measure(mode: str, args: argparse.Namespace, model_dir: Path, root: Path) -> list[float]:
    folder = root / f"{mode}-photos"
    folder.mkdir()
    (folder / "seed.jpg").write_bytes(photo(0))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNCLIP_")}
    env.update(
        CNCLIP_DATA_DIR=str(root / f"{mode}-data"),
        CNCLIP_MODEL_DIR=str(model_dir),
        CNCLIP_WATCH_QUIET_S=str(args.quiet),
        PYTHONPATH=str(ROOT),
    )
    processes = []
    try:
        if mode == "external":
            processes.append(cnclip(["index", str(folder), "-c", mode, "--watch"], env, root / f"{mode}-index.log"))
        server_env = {**env, "CNCLIP_WATCH": json.dumps({str(folder): mode})} if mode == "serve" else env
        processes.append(cnclip(["serve", "--port", str(port)], server_env, root / f"{mode}-serve.log"))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            deadline = time.monotonic() + 300
            while True:  # the server answers and the first pass indexed the seed photo
                try:
                    if "seed.jpg" in names(client, mode):
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                    raise RuntimeError(f"{mode}: did not start; see the logs under {root}")
                time.sleep(0.1)
            latencies = []
            for i in range(args.n):
                name = f"photo-{i:04d}.jpg"
                with open(folder / name, "wb") as f:
                    f.write(photo(i + 1))
                latencies.append(wait_for(client, mode, name, args.timeout))  # from the close
                time.sleep(args.gap)
            return latencies
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=20, help="files per mode")
    parser.add_argument("--quiet", type=float, default=1.0, help="CNCLIP_WATCH_QUIET_S")
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between files")
    parser.add_argument("--timeout", type=float, default=30.0, help="longest wait for one file")
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the shipped demo model)")
    parser.add_argument("--modes", default="serve,external")
    parser.add_argument("--smoke", action="store_true", help="3 files per mode on the toy model")
    args = parser.parse_args()
    if args.n < 1 or args.quiet <= 0 or args.gap < 0 or args.timeout <= 0:
        parser.error("-n must be at least 1, --quiet and --timeout positive, --gap not negative")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = args.model or ROOT / "models" / "cnclip-demo"
        if args.smoke:
            from retrieval.toolchain.toy_model import write_toy_model

            args.n = min(args.n, 3)
            model_dir = root / "toy-model"
            write_toy_model(model_dir)
        print(f"model {model_dir.name}, quiet period {args.quiet} s, {args.n} files per mode, {os.cpu_count()} CPUs")
        print("| mode | files | median ms | min ms | max ms |\n| --- | --- | --- | --- | --- |")
        for mode in args.modes.split(","):
            ms = [t * 1000 for t in measure(mode, args, model_dir, root)]
            print(f"| {mode} | {len(ms)} | {statistics.median(ms):.0f} | {min(ms):.0f} | {max(ms):.0f} |")


if __name__ == "__main__":
    main()
