"""Converted graphs vs the fair PyTorch baseline: items/s per tower and batch, % of GEMM peak, parity.

Usage (the model directory comes from `cnclip convert --arch ViT-B-16 --random-init`, whose weights
this script rebuilds from the same seed):

    python benchmarks/bench_convert.py --model-dir /work/bench-models/vitb16-v1 --rounds 5 --json out.json

Engines: the five PyTorch baselines of `benchmarks/torch_baselines.py` (eager fp32 on 1 and on
`--threads` threads, bf16 autocast, cn_clip's own model, dynamic int8; "best PyTorch" is the fastest, and every
ratio is against it), ONNX Runtime fp32 and int8 graphs of the model directory, and int8
experiments built here from its fp32 graph (`--experiments`): attention matmuls quantized too,
per-tensor weights, ORT's transformer fusion before quantization, static QDQ.

Rounds are interleaved (every engine once per round, the GEMM peaks of `benchmarks/peak.py` too) so
machine noise hits all alike; each figure is the median over rounds, with min and max. % of peak =
2 · the graph's multiply-accumulates per run / seconds per run / the measured peak at the engine's
thread count (int8 engines against the int8 peak, the others against fp32). The report names the
CPU's SIMD flags and the load average before and after. Parity: the minimum row cosine against
eager fp32 on the benchmark inputs, and for ORT engines the top-10 text→image neighbour overlap on
a 48-picture gallery.

`--text-length L` times the text tower at L tokens: PyTorch on [b, L] ids, ORT on
`text.{precision}.b{batch}.l{L}.onnx` in the model directory when that file exists.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.int8_experiments import fused_int8, static_int8, variant_graph  # noqa: E402
from benchmarks.peak import (  # noqa: E402
    LAYER_SHAPES,
    Peak,
    cpu_flags,
    graph_macs,
    measure_peaks,
    merge_rounds,
    parse_shape,
    peak_for,
    peak_graphs,
    peak_table,
    percent_of_peak,
)
from benchmarks.torch_baselines import BEST, Runner, best_of, model_config, random_model, torch_baselines  # noqa: E402
from retrieval.manifest import ModelManifest  # noqa: E402
from retrieval.tokenizer import tokenize  # noqa: E402
from retrieval.toolchain.convert.parity import PARITY_SENTENCES, cosines, run_in_buckets, sample_images, topk_overlap  # noqa: E402


def session_runner(
    path: Path, threads: int, options_hook: Callable[[ort.SessionOptions], None] | None = None
) -> Runner:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    # Idle ORT threads spin by default; with many sessions on a shared 2-core box that steals the
    # CPU from whichever engine is being timed, so every session here sleeps when idle.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if options_hook:
        options_hook(options)
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


def items_per_second(run: Runner, x: np.ndarray, seconds: float) -> float:
    run(x)  # warm: caches and thread pools after the previous engine
    count, started = 0, time.perf_counter()
    while True:
        run(x)
        count += 1
        elapsed = time.perf_counter() - started
        # Two calls at least, unless one call alone outlasts two periods (bf16 autocast on a CPU without bf16).
        if elapsed >= seconds and (count >= 2 or elapsed >= 2 * seconds):
            return count * len(x) / elapsed


@dataclass
class Engine:
    """One way to run a tower at one batch size, and what its speed is compared with."""

    label: str
    run: Runner
    peak_precision: str  # the peak its "% of peak" is against: "int8" or "fp32"
    threads: int
    macs: int | None  # multiply-accumulates per run (its graph's, or the fp32 graph's for PyTorch)
    is_torch: bool = False


def graph_file(manifest: ModelManifest, tower: str, precision: str, batch: int, length: int) -> Path | None:
    """The model directory's graph for a tower, precision, batch and (text) token length, if it has one.

    Text graphs at a length other than the manifest's context length are found by file name
    (`text.int8.b1.l16.onnx`), whether or not the manifest lists them.
    """
    if tower == "text" and length != manifest.context_length:
        assert manifest.directory is not None
        path = manifest.directory / f"text.{precision}.b{batch}.l{length}.onnx"
        return path if path.is_file() else None
    return (
        manifest.graph_path(tower, precision, batch)
        if batch in manifest.towers[tower].graphs.get(precision, {})
        else None
    )


def build_engines(
    args: argparse.Namespace, manifest: ModelManifest, config: dict, inputs: dict[str, np.ndarray], workdir: Path
) -> dict[tuple[str, int], dict[str, Engine]]:
    torch.set_num_threads(args.threads)
    model = random_model(config, args.seed)  # as `cnclip convert --random-init --seed` does
    engines_by_key: dict[tuple[str, int], dict[str, Engine]] = {}
    for tower in args.towers:
        for b in args.batch_sizes:
            graphs = {p: graph_file(manifest, tower, p, b, args.length) for p in ("fp32", "int8")}
            reference = graphs["fp32"] or graphs["int8"]
            macs = graph_macs(reference) if reference else None
            engines: dict[str, Engine] = {}
            for baseline in torch_baselines(model, tower, args.threads, args.torch_baselines):
                threads = 1 if baseline.key.endswith("-1t") else args.threads
                peak = "int8" if baseline.key == "dynamic-int8" else "fp32"
                engines[baseline.key] = Engine(baseline.label, baseline.run, peak, threads, macs, is_torch=True)
            for precision, path in graphs.items():
                if path is not None:
                    run = session_runner(path, args.threads)
                    engines[f"ort-{precision}"] = Engine(
                        f"ORT {precision} ({path.name})", run, precision, args.threads, graph_macs(path)
                    )
            fp32 = graphs["fp32"]
            if args.experiments and fp32 is not None:
                experiments = {
                    "int8+attn-matmuls": variant_graph(fp32, tower, workdir, quantize_activation_matmuls=True),
                    "int8-per-tensor": variant_graph(fp32, tower, workdir, per_channel=False),
                    "fused+int8": fused_int8(fp32, tower, config, workdir),
                    "static-qdq-int8": static_int8(
                        fp32, tower, workdir, inputs[tower][8:] if tower == "image" else inputs[tower], b
                    ),
                }
                for name, path in experiments.items():
                    engines[name] = Engine(name, session_runner(path, args.threads), "int8", args.threads, macs)
            if not graphs["fp32"] and not graphs["int8"]:
                print(f"note: no {tower} graph at batch {b}, length {args.length}: PyTorch only", file=sys.stderr)
            engines_by_key[tower, b] = engines
    return engines_by_key


def key_name(tower: str, batch: int, length: int, default_length: int) -> str:
    return f"{tower}/b{batch}" + (f"/l{length}" if tower == "text" and length != default_length else "")


def report_rows(
    engines: dict[str, Engine], speeds: dict[str, list[float]], batch: int, x: np.ndarray, peaks: list[Peak]
) -> tuple[dict[str, dict], str]:
    """Per engine: median items/s with min/max, ratios to eager and to the best PyTorch, % of peak, cosine."""
    medians = {name: statistics.median(values) for name, values in speeds.items()}
    best_torch, _ = best_of({name: medians[name] for name, e in engines.items() if e.is_torch})
    reference = engines["eager-fp32"].run(x)
    row: dict[str, dict] = {}
    for name, engine in engines.items():
        peak = peak_for(peaks, engine.peak_precision, engine.threads)
        percent = percent_of_peak(engine.macs, batch / medians[name], peak.gops) if peak and engine.macs else None
        row[name] = {
            "label": engine.label,
            "items_per_s": round(medians[name], 3),
            "min": round(min(speeds[name]), 3),
            "max": round(max(speeds[name]), 3),
            "vs_eager": round(medians[name] / medians["eager-fp32"], 2),
            "vs_best_torch": round(medians[name] / medians[best_torch], 2),
            "percent_of_peak": round(percent, 1) if percent is not None else None,
            "peak": f"{engine.peak_precision} × {engine.threads} thread{'s' if engine.threads > 1 else ''}"
            if peak
            else None,
            "min_cosine": float(cosines(engine.run(x), reference).min()),
            "runs": [round(s, 3) for s in speeds[name]],
        }
    return row, best_torch


def markdown_table(key: str, row: dict[str, dict], best_torch: str) -> list[str]:
    lines = [
        f"**{key}** ({BEST}: {row[best_torch]['label']})",
        "",
        f"| engine | items/s (median) | min–max | × {BEST} | % of peak | min cosine vs eager |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in row.items():
        label = f"**{r['label']}** ({BEST})" if name == best_torch else r["label"]
        percent = f"{r['percent_of_peak']:.1f} % of {r['peak']}" if r["percent_of_peak"] is not None else "–"
        lines.append(
            f"| {label} | {r['items_per_s']:.2f} | {r['min']:.2f}–{r['max']:.2f} | {r['vs_best_torch']:.2f}× "
            f"| {percent} | {r['min_cosine']:.5f} |"
        )
    return [*lines, ""]


def top10_overlaps(
    engines_by_key: dict[tuple[str, int], dict[str, Engine]], batch: int, images: np.ndarray, texts: np.ndarray
) -> dict[str, float]:
    """Text→image top-10 neighbour overlap against eager fp32, per ORT engine that both towers have."""
    image_engines, text_engines = engines_by_key["image", batch], engines_by_key["text", batch]

    def encode(run: Runner, data: np.ndarray) -> np.ndarray:
        return run_in_buckets(run, data, batch)

    ref_img = encode(image_engines["eager-fp32"].run, images)
    ref_txt = encode(text_engines["eager-fp32"].run, texts)
    overlap = {}
    for name, engine in image_engines.items():
        if not engine.is_torch and name in text_engines:
            got_img, got_txt = encode(engine.run, images), encode(text_engines[name].run, texts)
            overlap[name] = topk_overlap(ref_txt, ref_img, got_txt, got_img)
    return overlap


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.5, help="timed seconds per engine per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="the --seed the model was converted with")
    parser.add_argument("--experiments", action="store_true", help="also build and time the int8 experiments")
    parser.add_argument(
        "--torch-baselines",
        default="all",
        help="comma-separated: eager-fp32-1t, eager-bf16, cnclip-fp32, dynamic-int8 (eager-fp32 always runs: the reference)",
    )
    parser.add_argument("--towers", default="image,text", help="image, text or both (the overlap needs both)")
    parser.add_argument("--text-length", type=int, help="text tokens (default: the model's context length)")
    parser.add_argument("--peak-seconds", type=float, default=0.3, help="timed seconds per peak GEMM per round")
    parser.add_argument("--no-peak", action="store_true", help="skip the GEMM peak (no %% of peak column)")
    parser.add_argument("--peak-shape", type=parse_shape, action="append", help="M,K,N of a peak GEMM (repeatable)")
    parser.add_argument("--json", type=Path, help="write all numbers here")
    return parser, parser.parse_args(argv)


def measure_rounds(
    args: argparse.Namespace, engines_by_key: dict[tuple[str, int], dict[str, Engine]], inputs: dict[str, np.ndarray]
) -> tuple[dict[tuple[str, int], dict[str, list[float]]], list[Peak]]:
    """Every engine (and the GEMM peak) once per round: noise hits every engine alike."""
    peak_inputs = None if args.no_peak else peak_graphs(args.peak_shape or LAYER_SHAPES)
    round_peaks: list[list[Peak]] = []
    speeds: dict[tuple[str, int], dict[str, list[float]]] = {
        key: {name: [] for name in engines} for key, engines in engines_by_key.items()
    }
    for number in range(1, args.rounds + 1):
        if peak_inputs is not None:
            peak_threads = sorted({1, args.threads})
            round_peaks.append(measure_peaks(peak_threads, 1, args.peak_seconds, peak_inputs, spin=False))
        for (tower, b), engines in engines_by_key.items():
            x = inputs[tower][:b]
            for name, engine in engines.items():
                speeds[tower, b][name].append(items_per_second(engine.run, x, args.seconds))
        print(f"round {number}/{args.rounds} done; load average {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    return speeds, merge_rounds(round_peaks)


def print_report(
    args: argparse.Namespace, argv: list[str] | None, machine: dict, peaks: list[Peak], lines: list[str], overlap: dict
) -> None:
    print()
    print(
        f"- {machine['date']}; {machine['cores']} cores, {args.threads} threads per engine; CPU {machine['cpu_flags']}; "
        f"torch {machine['torch']}, onnxruntime {machine['onnxruntime']}"
    )
    print(
        f"- load average (1/5/15 min) before {machine['load_average_before']}, after {machine['load_average_after']}; "
        f"{args.rounds} interleaved rounds × {args.seconds:g} s per engine, medians with min–max"
    )
    print(f"- command: `python benchmarks/bench_convert.py {' '.join(argv if argv is not None else sys.argv[1:])}`")
    print()
    if peaks:
        print("\n".join(peak_table(peaks)))
        print()
    print("\n".join(lines))
    print("top-10 text→image overlap vs eager:", {k: f"{v:.1%}" for k, v in overlap.items()})


def main(argv: list[str] | None = None) -> None:
    parser, args = parse_args(argv)
    load_before = os.getloadavg()
    manifest = ModelManifest.load(args.model_dir, verify=False)
    config = model_config(manifest)
    if config is None:
        parser.error(f"{args.model_dir}: no architecture config in the manifest and {manifest.arch!r} is not released")
    args.batch_sizes = [int(b) for b in args.batches.split(",")]
    args.towers = [t for t in ("image", "text") if t in args.towers.split(",")]
    args.length = args.text_length or manifest.context_length
    images = sample_images(48, manifest.image_size, seed=11)
    texts = tokenize(list(PARITY_SENTENCES), args.length)
    inputs = {"image": images, "text": texts}
    workdir = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    engines_by_key = build_engines(args, manifest, config, inputs, workdir)
    machine = {
        "cpu_flags": cpu_flags(),
        "cores": len(os.sched_getaffinity(0)),
        "threads": args.threads,
        "load_average_before": [round(v, 2) for v in load_before],
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(f"CPU: {machine['cpu_flags']}; load average before: {load_before[0]:.2f}", flush=True)
    speeds, peaks = measure_rounds(args, engines_by_key, inputs)

    results: dict[str, object] = {"machine": machine, "peaks": [p.to_json() for p in peaks]}
    best: dict[str, str] = {}
    lines: list[str] = []
    for (tower, b), engines in engines_by_key.items():
        key = key_name(tower, b, args.length, manifest.context_length)
        row, best[key] = report_rows(engines, speeds[tower, b], b, inputs[tower][:b], peaks)
        results[key] = row
        lines += markdown_table(key, row, best[key])
    results["best_torch"] = best
    # Top-10 text→image overlap against eager, per ORT engine present for both towers at the largest batch.
    overlap = top10_overlaps(engines_by_key, max(args.batch_sizes), images, texts) if len(args.towers) == 2 else {}
    results["top10_overlap_text_to_image"] = overlap
    machine["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    print_report(args, argv, machine, peaks, lines, overlap)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
