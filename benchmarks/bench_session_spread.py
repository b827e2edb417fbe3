"""How much one tower's batch-1 time varies from one fresh process to the next (issue 34).

    python benchmarks/bench_session_spread.py --model /work/bench-models/vitb16 --tower image --processes 10

Each process opens the tower's sessions as `cnclip serve` does by default on ONNX Runtime's CPU (one
shape-dynamic session, its own prepacked copy, all cores; `--mode prepacked|shared`: a session per
bucket, as `CNCLIP_DYNAMIC_SHAPES=false` and the tuner's other configurations), runs every bucket
once, then times batch 1 for `--seconds` (the median call). Comparisons between servers, or between
the tuner's configurations, open their sessions in different processes or at different times: where
this spread is wide, a single process per side measures which process was lucky, not which
configuration is faster. Prints one line per process and the spread.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.machine import machine  # noqa: E402

_ONE = """
import os, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from retrieval.manifest import ModelManifest
from retrieval.sessions import dummy_batch
from retrieval.toolchain.tune.measure import Config, open_config, shapes_of, time_calls
from retrieval.toolchain.tune.tuner import candidates

manifest = ModelManifest.load(Path({model!r}))
found, _ = candidates(manifest, ["onnxruntime"])
candidate = next(c for c in found[{tower!r}] if c.precision == {precision!r})
shapes = shapes_of(manifest, {tower!r}, candidate.graph, ())
sessions = open_config(manifest, {tower!r}, Config(candidate, {mode!r}), shapes, sorted(os.sched_getaffinity(0)))
batches = {{s: dummy_batch({tower!r}, s[0], manifest.image_size, s[1] or manifest.context_length) for s in shapes}}
for shape in shapes:
    sessions[shape].run(batches[shape])
one = min(shapes, key=lambda s: (s[0], -(s[1] or manifest.context_length)))
print(time_calls(lambda: sessions[one].run(batches[one]), {seconds!r}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--tower", choices=("image", "text"), default="image")
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--mode", choices=("dynamic", "prepacked", "shared"), default="dynamic")
    parser.add_argument("--processes", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    print(f"{machine()}; {args.model.name} {args.tower} {args.precision} {args.mode}")
    code = _ONE.format(repo=str(REPO), model=str(args.model), tower=args.tower, precision=args.precision,
                       mode=args.mode, seconds=args.seconds)  # fmt: skip
    times = []
    for index in range(args.processes):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        times.append(float(done.stdout.split()[-1]))
        print(f"process {index + 1}: batch 1 {times[-1]:.2f} ms", flush=True)
    fastest = min(times)
    slow = sum(t > 1.2 * fastest for t in times)
    print(f"min {fastest:.2f}, median {statistics.median(times):.2f}, max {max(times):.2f} ms; "
          f"{slow} of {len(times)} processes over 1.2x the fastest")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
