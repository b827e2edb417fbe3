"""What an OpenVINO tower holds once its shapes have run: the weight file it keeps mapped, given back
or not (retrieval/backends/mapped_weights.py).

    # the ViT-B-16 image tower in bf16 (an AMX or AVX512_BF16 CPU), 3 rounds, each mode in a fresh process
    python benchmarks/bench_openvino_memory.py --model /work/bench-models/vitb16 --tower image --run-precision bf16

Each round opens the tower's bucket graphs as one stream does (`OpenVinoSession`, one compiled model
for every bucket), runs every bucket once, and reads the process's memory: resident growth from a
warm base (OpenVINO's plugin loaded), the resident pages of the model's weight files (`*.data`
mappings in /proc/self/smaps), RssAnon, RssFile and the peak (VmHWM); then runs every bucket three
times more and reads the weight files' resident pages again. `kept` switches the release
off; `released` is what ships. The modes alternate within each round; memory is not timing-sensitive.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.machine import machine  # noqa: E402

ONE_ROUND = """
import json, sys
from pathlib import Path
import numpy as np
import openvino as ov
import retrieval.backends.openvino as backend
from retrieval.backends.base import SessionConfig
from retrieval.manifest import ModelManifest

model, tower, run_precision, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
if mode == "kept":
    backend.release_resident = lambda folders: 0


def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def mapped_mb():
    kb, current = 0, ""
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if not fields[0].endswith(":"):
            current = fields[5] if len(fields) > 5 else ""
        elif fields[0] == "Rss:" and current.endswith(".data"):
            kb += int(fields[1])
    return kb / 1024


x = ov.opset13.parameter([1], ov.Type.f32)  # the plugin loaded before the base is read
backend._core().compile_model(ov.Model([ov.opset13.relu(x)], [x]), "CPU")
before = status("VmRSS")
manifest = ModelManifest.load(model, verify=False)
spec = manifest.towers[tower]
precision = "int8-qdq" if run_precision == "int8" else "fp32"
config = SessionConfig(provider="CPU", precision=precision, cores=[0, 1], backend="openvino", run_precision=run_precision)
lengths = [None] if tower == "image" else [None, *manifest.towers["text"].short_lengths(precision)]
# Every shape opened before the first run, as a stream opens them: they compile as one model then.
sessions = {(b, length): backend.OpenVinoSession(manifest.graph_path(tower, precision, b, length), config,
                                                 spec.input_name, spec.output_name)
            for length in lengths for b in spec.buckets(precision)}
rng = np.random.default_rng(0)
batches = {}
for (b, length), session in sessions.items():
    if tower == "image":
        batch = rng.standard_normal((b, 3, manifest.image_size, manifest.image_size)).astype(np.float32)
    else:
        batch = rng.integers(1, 1000, (b, length or manifest.context_length)).astype(np.int64)
    batches[b, length] = batch
    session.run(batch)
read = {"grew": status("VmRSS") - before, "weight_files": mapped_mb(), "anon": status("RssAnon"),
        "file": status("RssFile"), "peak": status("VmHWM")}
for key, session in sessions.items():  # later runs: what of the weight file do they read back?
    for _ in range(3):
        session.run(batches[key])
print(json.dumps({**read, "weight_files_later": mapped_mb()}))
"""


def one_round(model: Path, tower: str, run_precision: str, mode: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", ONE_ROUND, str(model), tower, run_precision, mode],
        capture_output=True, text=True, timeout=1200, cwd=REPO_ROOT, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{mode}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--tower", choices=("image", "text"), default="image")
    parser.add_argument("--run-precision", choices=("fp32", "bf16", "int8"), default="bf16")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    print(f"{args.tower} tower of {args.model}, OpenVINO CPU {args.run_precision}, every bucket run once\n")
    results: dict[str, list[dict[str, float]]] = {"kept": [], "released": []}
    for round_ in range(args.rounds):
        for mode in ("kept", "released") if round_ % 2 == 0 else ("released", "kept"):
            results[mode].append(one_round(args.model, args.tower, args.run_precision, mode))
    print("| weight file | resident growth MB | weight files resident MB | RssAnon MB | RssFile MB | peak MB "
          "| weight files resident after 3 more runs MB |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode, rows in results.items():
        cells = []
        for key in ("grew", "weight_files", "anon", "file", "peak", "weight_files_later"):
            values = sorted(r[key] for r in rows)
            cells.append(f"{values[len(values) // 2]:.0f} ({values[0]:.0f}–{values[-1]:.0f})")
        print(f"| {mode} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
