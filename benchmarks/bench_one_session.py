"""One tower's engine alone, per row, by batch size: how its sessions hold the weights and spin (issue 34).

    python benchmarks/bench_one_session.py --model /work/bench-models/vitb16 --tower text --length 16

Configurations, interleaved in every round (median ms per run over `--rounds`, each round the mean of
`--calls` runs), all on `--threads` intra-op threads:

- `per bucket, shared` — a session per bucket graph on the tower's one mapped copy, prepacking and the
  arena off, no spinning (the default before `CNCLIP_DYNAMIC_SHAPES`);
- `one session` — the bucket graphs as one shape-dynamic graph (retrieval/backends/ort_batch.py), its
  own prepacked copy, no spinning; batch sizes between the buckets run unpadded;
- `one session, spin in run` — the same, its pool spinning inside a run and stopping when it ends
  (`session.force_spinning_stop`: what `cnclip serve` runs now);
- `static bucket, prepacked` — each bucket graph on its own, ONNX Runtime's defaults (what Triton's
  Python backend runs), where the batch size is a bucket.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import machine  # noqa: E402
from retrieval.backends.ort_batch import dynamic_graph, input_shape  # noqa: E402
from retrieval.manifest import ModelManifest  # noqa: E402
from retrieval.shared_weights import SharedWeights  # noqa: E402

Run = Callable[[np.ndarray], object]


def options(threads: int, spin: str, folder: Path | None = None, shared: bool = False):  # noqa: ANN201
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.intra_op_num_threads, o.inter_op_num_threads = threads, 1
    if spin == "off":
        o.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif spin == "in run":
        o.add_session_config_entry("session.force_spinning_stop", "1")
    if folder is not None:
        o.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    if shared:
        o.add_session_config_entry("session.disable_prepacking", "1")
        o.enable_cpu_mem_arena = False
    return o


def configurations(manifest: ModelManifest, tower: str, precision: str, length: int | None, threads: int):
    """name -> {batch size it runs: run}."""
    import onnxruntime as ort

    spec = manifest.towers[tower]
    buckets = spec.buckets(precision)
    paths = {b: manifest.graph_path(tower, precision, b, length) for b in buckets}
    cpu = ["CPUExecutionProvider"]
    weights = SharedWeights(f"{tower}/{precision}")
    per_bucket, static = {}, {}
    for b, path in paths.items():
        shared = options(threads, "off", shared=True)
        weights.add_to(shared, path)
        per_bucket[b] = ort.InferenceSession(str(path), shared, providers=cpu)
        static[b] = ort.InferenceSession(str(path), options(threads, "off"), providers=cpu)
    graph = dynamic_graph({input_shape(p): p for p in paths.values()})
    blob = graph.model.SerializeToString()
    one = {
        spin: ort.InferenceSession(blob, options(threads, spin, graph.folder), providers=cpu)
        for spin in ("off", "in run")
    }
    name = spec.input_name

    def runner(session) -> Run:  # noqa: ANN001
        return lambda batch: session.run(None, {name: batch})

    most = max(buckets)
    return {
        "per bucket, shared": {b: runner(s) for b, s in per_bucket.items()},
        "one session": {b: runner(one["off"]) for b in range(1, most + 1)},
        "one session, spin in run": {b: runner(one["in run"]) for b in range(1, most + 1)},
        "static bucket, prepacked": {b: runner(s) for b, s in static.items()},
    }, weights


def batch_of(tower: str, rows: int, length: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if tower == "image":
        return rng.normal(0.0, 1.0, (rows, 3, 224, 224)).astype(np.float32)
    ids = rng.integers(103, 21128, (rows, length)).astype(np.int64)
    ids[:, 0], ids[:, length // 2], ids[:, length // 2 + 1 :] = 101, 102, 0
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--tower", choices=("text", "image"), default="text")
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--length", type=int, default=0, help="text length bucket (0: the full length)")
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args(argv)
    manifest = ModelManifest.load(args.model)
    length = args.length if 0 < args.length < manifest.context_length else None
    print(f"{machine()}; {args.model.name} {args.tower} {args.precision}, length {length or manifest.context_length}")
    configs, _weights = configurations(manifest, args.tower, args.precision, length, args.threads)  # weights live on
    batches = [int(b) for b in args.batches.split(",")]
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for rows in batches:
            batch = batch_of(args.tower, rows, length or manifest.context_length)
            for name, runs in configs.items():
                if rows in runs:
                    runs[rows](batch)  # a new shape's first run is not its cost
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        runs[rows](batch)
                    times.setdefault((name, rows), []).append((time.perf_counter() - start) / args.calls)
    print("| configuration | " + " | ".join(f"batch {b}: ms (per row)" for b in batches) + " |")
    print("| --- |" + " ---: |" * len(batches))
    for name in configs:
        cells = []
        for rows in batches:
            runs = times.get((name, rows))
            median = statistics.median(runs) * 1000 if runs else None
            cells.append(f"{median:.1f} ({median / rows:.2f})" if median else "—")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
