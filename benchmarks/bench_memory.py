"""Memory of `cnclip serve` with and without shared weights, against the weight files' size.

    # RSS of the server (ViT-B-16 int8, every default bucket), shared weights vs one copy per session
    python benchmarks/bench_memory.py serve --model /work/bench-models/vitb16-v1 --precision int8

    # what sharing costs per run: bucket sessions of one tower, shared vs own copy, interleaved rounds
    python benchmarks/bench_memory.py latency --model /work/bench-models/vitb16-v1 --tower text --batches 1,8

`serve` starts the server of this checkout (`CNCLIP_SHARE_WEIGHTS=true`, then `false`, or with a
tuning file and the default memory budget: `--modes share,tuned=FILE`; the CPU provider and an empty
data directory), waits for /readyz (every bucket has run once), reads the
process's VmRSS, VmHWM, RssAnon, RssFile and Pss, then sends each text and image bucket size twice
(a session's arena grows again on its second run) and reads them again. The budget is the size of
the loaded graph and data files plus 600 MB. `latency` opens the sessions as the encoder does
(`OrtSession`, `SessionConfig`), so it measures what ships; memory is not timing-sensitive, latency is.
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from retrieval.manifest import ModelManifest  # noqa: E402

BUDGET_MB = 600
MB = 1 << 20


def weight_files(model_dir: Path, precision: str, buckets: list[int]) -> dict[str, int]:
    """The files the server loads: both towers' graphs of `precision` and `buckets`, and their data files."""
    manifest = ModelManifest.load(model_dir, verify=False)
    names = {manifest.towers[t].graphs[precision][b] for t in manifest.towers for b in buckets}
    names |= {p.name for p in model_dir.glob(f"*.{precision}.data")}
    return {name: (model_dir / name).stat().st_size for name in sorted(names)}


def process_memory(pid: int) -> dict[str, float]:
    """MB: VmRSS and VmHWM (peak), RssAnon and RssFile, and Pss (file pages split among sharers)."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, value = line.partition(":")
        if key == "Pss":
            out["Pss"] = int(value.split()[0]) / 1024
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(env: dict[str, str], log_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """This checkout's `cnclip serve` in a subprocess, ready when /readyz answers 200."""
    port = free_port()
    command = [sys.executable, "-c", "from cli.main import main; main()", "serve", "--port", str(port)]
    env = {**os.environ, **env, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with log_path.open("w") as log:
        proc = subprocess.Popen([*command, "--log-level", "info"], stdout=log, stderr=log, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 900
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"cnclip serve exited with {proc.returncode}; see {log_path}")
                try:
                    if httpx.get(url + "/readyz", timeout=2.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("cnclip serve did not become ready in 900 s")
                time.sleep(0.5)
            yield proc, url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def traffic(url: str, buckets: list[int], passes: int = 2) -> None:
    """One request per bucket size and tower, sent one at a time so each lands in exactly that bucket."""
    with httpx.Client(base_url=url, timeout=600) as client:
        for _ in range(passes):
            for n in buckets:
                texts = [f"第{i}张图片里的小猫" for i in range(n)]
                client.post("/v1/embed/text", json={"texts": texts}).raise_for_status()
                files = [("file", (f"{i}.jpg", jpeg(i), "image/jpeg")) for i in range(n)]
                client.post("/v1/embed/image", files=files).raise_for_status()


def run_serve(args: argparse.Namespace) -> None:
    model_dir = Path(args.model).resolve()
    buckets = [int(b) for b in args.buckets.split(",")]
    files = weight_files(model_dir, args.precision, buckets)
    weights_mb = sum(files.values()) / MB
    print(f"model {model_dir}, precision {args.precision}, buckets {buckets}")
    print(f"weight files: {len(files)}, {weights_mb:.0f} MB; budget: {weights_mb + BUDGET_MB:.0f} MB\n")
    header = f"{'mode':<10} {'moment':<14} {'VmRSS':>7} {'VmHWM':>7} {'RssAnon':>8} {'RssFile':>8} {'Pss':>7}  budget"
    rows = [header]
    report: dict[str, dict[str, dict[str, float]]] = {}
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory(prefix="bench-memory-") as data_dir:
            env = {
                "CNCLIP_MODEL_DIR": str(model_dir),
                "CNCLIP_PROVIDER": "cpu",
                "CNCLIP_DATA_DIR": data_dir,
                "CNCLIP_BUCKETS": json.dumps(buckets),
            }
            if mode.startswith("tuned="):  # what the tuning file chose, the default memory budget (auto)
                tuning = Path(mode.removeprefix("tuned="))
                env["CNCLIP_TUNING_FILE"] = str(tuning.resolve())
                mode = f"tuned {tuning.stem}"
            else:
                env["CNCLIP_PRECISION"] = args.precision
                # dynamic: one shape-dynamic session per stream (the default); share / no-share: a session per bucket
                env["CNCLIP_DYNAMIC_SHAPES"] = "true" if mode == "dynamic" else "false"
                env["CNCLIP_SHARE_WEIGHTS"] = "true" if mode == "share" else "false"
                env["CNCLIP_TUNING_FILE"] = str(Path(data_dir) / "none.json")  # no tuning file
            log_path = Path(data_dir) / "serve.log"
            started = time.perf_counter()
            with serve(env, log_path) as (proc, url):
                ready_s = time.perf_counter() - started
                moments = {"ready": process_memory(proc.pid)}
                traffic(url, buckets)
                moments["after traffic"] = process_memory(proc.pid)
            lines = [line for line in log_path.read_text().splitlines() if "weights" in line or "budget" in line]
        report[mode] = moments
        print(f"{mode}: ready in {ready_s:.0f} s")
        for line in lines:
            print("  " + line.split("retrieval.encoder: ")[-1])
        for moment, m in moments.items():
            verdict = "within" if m["VmRSS"] <= weights_mb + BUDGET_MB else "OVER"
            rows.append(
                f"{mode:<10} {moment:<14} {m['VmRSS']:>7.0f} {m['VmHWM']:>7.0f} {m['RssAnon']:>8.0f} "
                f"{m['RssFile']:>8.0f} {m['Pss']:>7.0f}  {verdict}"
            )
    print("\nMB (VmRSS against the budget; VmHWM is the peak, reached while the largest bucket runs)")
    print("\n".join(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"weights_mb": weights_mb, "modes": report}, indent=2))


def run_latency(args: argparse.Namespace) -> None:
    from retrieval.backends.base import SessionConfig
    from retrieval.sessions import OrtSession, dummy_batch
    from retrieval.shared_weights import SharedWeights

    manifest = ModelManifest.load(Path(args.model), verify=False)
    spec = manifest.towers[args.tower]
    batches = [int(b) for b in args.batches.split(",")]
    cores = list(range(args.threads))
    sessions: dict[tuple[str, int], OrtSession] = {}
    for mode in ("own copy", "shared"):
        weights = SharedWeights(f"{args.tower}/{args.precision}") if mode == "shared" else None
        # No spinning: with many sessions on a shared box, an idle session's spinning threads steal the CPU.
        config = SessionConfig("cpu", args.precision, cores=cores, spin=False, weights=weights)
        for b in batches:
            path = manifest.graph_path(args.tower, args.precision, b)
            sessions[mode, b] = OrtSession(path, config, spec.input_name, spec.output_name)
    inputs = {b: dummy_batch(args.tower, b, manifest.image_size, manifest.context_length) for b in batches}
    for (_, b), session in sessions.items():
        session.run(inputs[b])
    times: dict[tuple[str, int], list[float]] = {key: [] for key in sessions}
    for r in range(args.rounds):
        order = list(sessions) if r % 2 == 0 else list(reversed(sessions))
        for _ in range(args.reps):
            for key in order:
                start = time.perf_counter()
                sessions[key].run(inputs[key[1]])
                times[key].append(time.perf_counter() - start)
    print(f"{args.tower} {args.precision}, {args.threads} thread(s), {args.rounds} rounds x {args.reps} runs")
    for b in batches:
        own = statistics.median(times["own copy", b])
        shared = statistics.median(times["shared", b])
        print(
            f"  batch {b:>2}: own copy {own * 1000:8.1f} ms   shared {shared * 1000:8.1f} ms   {shared / own - 1:+.1%}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("serve", help="RSS of cnclip serve, shared weights vs one copy per session")
    s.add_argument("--model", required=True)
    s.add_argument("--precision", default="int8")
    s.add_argument("--buckets", default="1,4,8,16,32")
    s.add_argument(
        "--modes",
        default="dynamic,share,no-share",
        help="comma-separated: dynamic, share, no-share, tuned=TUNING_FILE (in that order)",
    )
    s.add_argument("--json", help="also write the numbers here")
    lat = commands.add_parser("latency", help="per-run time of bucket sessions, shared vs own copy")
    lat.add_argument("--model", required=True)
    lat.add_argument("--tower", default="text", choices=["text", "image"])
    lat.add_argument("--precision", default="int8")
    lat.add_argument("--batches", default="1,8")
    lat.add_argument("--threads", type=int, default=2)
    lat.add_argument("--rounds", type=int, default=3)
    lat.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    run_serve(args) if args.command == "serve" else run_latency(args)


if __name__ == "__main__":
    main()
