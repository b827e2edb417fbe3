"""`cnclip index --ray` on one and on two Ray nodes against a local `cnclip index`, on this machine.

    python benchmarks/bench_ray.py --images 2000 --rounds 3
    python benchmarks/bench_ray.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        --milvus-uri http://127.0.0.1:19530        # the committer into PostgreSQL and Milvus
    python benchmarks/bench_ray.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        --shards --modes ray-2,ray-2-shards        # batches against Parquet shards (PostgreSQL COPY)

Every run is the command a user types (a `cnclip index … --json` subprocess) into a collection of its
own, over the same folder of photo-sized JPEGs; rounds interleave the three modes (their order turns
each round), so a machine that slows down meanwhile slows all three alike. The Ray cluster is started
here (`ray.cluster_utils.Cluster`: a head and a second node of `--node-cpus` CPUs each, on this machine)
and only it is stopped at the end.

Reported per mode (medians over the rounds): images/s over the run as `--json` says it (`seconds`: from
the walk to the final flush; for `--ray` that includes joining the cluster and the actors loading the
model, for a local run the model was warmed before), images/s over the whole command (`wall_s`: the
process's start, imports and model load too), and for `--ray` the committer's rows/s (the driver's
commits through the collection service: SQL rows and vectors in one transaction each; with `--shards`,
the mode `ray-2-shards` commits through Parquet shards of `--shard-rows` rows, each loaded in one
transaction: its rate counts reading the shard back and the load). With the nodes
on one machine, two nodes share its cores: the number says what the distribution costs, not what a
second machine adds (docs/scaling-out.md says how to read it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_indexing import generate_jpegs  # noqa: E402
from retrieval.config import RuntimeSettings  # noqa: E402

MODES = ("local", "ray-1", "ray-2")
SHARDED = "ray-2-shards"  # two nodes, every run through Parquet shards (--shard-threshold 0)


def cpu_flags() -> dict[str, Any]:
    """The CPU's model and the vector extensions that decide ONNX Runtime's speed."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8")
    return {"model": model or platform.processor(), "cores": os.cpu_count(), "flags": [f for f in wanted if f in flags]}


def run_index(
    folder: Path, collection: str, env: dict[str, str], batch: int, address: str | None, shard_rows: int | None = None
) -> dict[str, Any]:
    args = ["index", str(folder), "-c", collection, "--batch-size", str(batch), "--json"]
    args += ["--ray", address] if address else []
    args += ["--shard-threshold", "0", "--shard-rows", str(shard_rows)] if shard_rows else []
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    summary = dict(json.loads(lines[-1]))
    summary["wall_s"] = wall
    return summary


def set_nodes(cluster: Any, nodes: int, node_cpus: float) -> None:
    """Add or remove the second node so that the cluster has `nodes` (1 or 2)."""
    workers = [node for node in cluster.list_all_nodes() if node is not cluster.head_node]
    while len(workers) + 1 > nodes:
        cluster.remove_node(workers.pop())
    while len(workers) + 1 < nodes:
        workers.append(cluster.add_node(num_cpus=node_cpus))
    cluster.wait_for_nodes()


def median(values: list[float]) -> float:
    return round(statistics.median(values), 2) if values else 0.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--node-cpus", type=float, default=1.0, help="CPUs each Ray node may schedule")
    parser.add_argument("--model-dir", type=Path, default=RuntimeSettings.model_fields["model_dir"].default)
    parser.add_argument("--database-url", default=None, help="default: a SQLite file of its own")
    parser.add_argument("--milvus-uri", default=None, help="default: FAISS files")
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--shards", action="store_true", help=f"add the mode {SHARDED}: commits through Parquet shards")
    parser.add_argument("--shard-rows", type=int, default=1000, help=f"{SHARDED}: rows per shard")
    parser.add_argument("--modes", default=None, help="comma-separated modes to run (default: all)")
    return parser.parse_args()


def measure(args: argparse.Namespace, folder: Path, env: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """Every mode once per round, in a turning order, on one cluster whose second node comes and goes."""
    from ray.cluster_utils import Cluster

    # Ray kills workers past 95% of the machine's memory, whoever holds it: not on a shared machine.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.node_cpus})
    modes: tuple[str, ...] = (*MODES, SHARDED) if args.shards else MODES
    modes = tuple(m for m in modes if m in args.modes.split(",")) if args.modes else modes
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    try:
        for round_no in range(args.rounds):
            order = modes[round_no % len(modes) :] + modes[: round_no % len(modes)]
            for mode in order:
                address = None
                if mode != "local":
                    set_nodes(cluster, int(mode.split("-")[1]), args.node_cpus)
                    address = cluster.address
                collection = f"bench_{mode.replace('-', '_')}_{round_no}"
                rows = args.shard_rows if mode == SHARDED else None
                summary = run_index(folder, collection, env, args.batch_size, address, rows)
                assert summary["indexed"] == args.images, summary
                runs[mode].append(summary)
                print(f"round {round_no} {mode}: {summary['indexed'] / summary['seconds']:.1f} images/s", flush=True)
    finally:
        cluster.shutdown()
    return runs


def main() -> None:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="cnclip-bench-ray-"))
    folder = work / "images"
    generate_jpegs(folder, args.images, (args.width, args.height))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNCLIP_")}
    env |= {"CNCLIP_DATA_DIR": str(work / "data"), "CNCLIP_MODEL_DIR": str(args.model_dir)}
    env |= {"CNCLIP_DATABASE_URL": args.database_url or f"sqlite:///{work / 'catalog.db'}"}
    if args.milvus_uri:
        env |= {"CNCLIP_VECTOR_STORE": "milvus", "CNCLIP_MILVUS_URI": args.milvus_uri}
    runs = measure(args, folder, env)
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "processor": cpu_flags(),
        "images": args.images,
        "size": [args.width, args.height],
        "rounds": args.rounds,
        "node_cpus": args.node_cpus,
        "catalog": env["CNCLIP_DATABASE_URL"].split(":", 1)[0],
        "vector_store": env.get("CNCLIP_VECTOR_STORE", "the default"),
        "modes": {
            mode: {
                "images_per_s": median([r["indexed"] / r["seconds"] for r in found]),
                "images_per_s_wall": median([r["indexed"] / r["wall_s"] for r in found]),
                "nodes": median([r.get("nodes", 1) for r in found]),
                "commit_rows_per_s": median([r["commit_rows_per_s"] for r in found if "commit_rows_per_s" in r]),
            }
            for mode, found in runs.items()
        },
    }
    print(json.dumps(report, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
