"""The model runtime's benchmark for BENCHMARKS.md: tokenizer, baselines, and the encoder sweep.

    python benchmarks/bench_encoders.py --model DIR [--repeats 3] [--duration 3] [--out report.md]

In one run, side by side:
1. tokenizer: distinct short queries/s on one core, ours vs cn_clip's FullTokenizer;
2. baselines, batch 1, one client, no batcher: ONNX Runtime fp32 straight on the bucket-1 graph
   and, when torch is importable and the model has a torch twin (a released architecture, or the
   config `cnclip convert` stored), the five PyTorch baselines of `benchmarks/torch_baselines.py`
   (eager fp32 on 1 and on all cores, bf16 autocast, cn_clip's own model, dynamic int8; random weights). Ratios
   are against the best of them per tower ("best PyTorch");
3. `cnclip bench encoders`' sweep (retrieval/toolchain/bench.py): text and image, concurrency 1–16,
   1 stream with the batcher on and off, 2 streams with it on, with a "% of peak" column: the
   sweep's items/s × the graph's multiply-accumulates per item against the machine's GEMM peak on
   all cores (`benchmarks/peak.py`, int8 or fp32 as the sweep's precision), measured in every repeat.
Every figure is the median of `--repeats` runs (min–max for the baselines). The header names the
CPU's SIMD flags and the load average before and after. Runs on the toy model as a smoke test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from api.config import Settings  # noqa: E402
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
from retrieval.backends.onnxruntime import choose_precision  # noqa: E402
from retrieval.manifest import ModelManifest  # noqa: E402
from retrieval.preprocess import preprocess_image  # noqa: E402
from retrieval.tokenizer import Tokenizer, tokenize  # noqa: E402
from retrieval.toolchain.bench import TABLE_HEADER, SweepPoint, image_payloads, run_sweep, text_payloads  # noqa: E402


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0))
    return f"{platform.machine()}, {cores} cores ({cpu}; {cpu_flags()}), load average {os.getloadavg()[0]:.2f} at start"


def time_loop(fn, seconds: float) -> tuple[int, float, list[float]]:
    """Call fn() back to back for `seconds`: (calls, elapsed, latencies)."""
    latencies = []
    end = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        t = time.perf_counter()
        fn()
        latencies.append(time.perf_counter() - t)
    return len(latencies), time.perf_counter() - start, latencies


# --- tokenizer -------------------------------------------------------------------------------
def bench_tokenizer(queries: int = 20_000) -> dict[str, float]:
    """Queries per CPU-second of this thread (one core), so other processes on the machine do not count."""
    texts = text_payloads(queries, seed=1)
    ours = Tokenizer()  # fresh caches: the first pass is a cold run over distinct queries
    start = time.thread_time()
    ours.tokenize(texts)
    cold = queries / (time.thread_time() - start)
    start = time.thread_time()
    ours.tokenize(texts)
    warm = queries / (time.thread_time() - start)
    result = {"ours_cold_qps": cold, "ours_warm_qps": warm}
    reference = _cn_clip_tokenizer()
    if reference is not None:
        sample = texts[:2000]
        start = time.thread_time()
        for text in sample:
            reference.convert_tokens_to_ids(reference.tokenize(text))
        result["cn_clip_qps"] = len(sample) / (time.thread_time() - start)
    return result


def _cn_clip_tokenizer():
    try:
        import cn_clip
    except ImportError:
        return None
    path = Path(cn_clip.__file__).parent / "clip" / "bert_tokenizer.py"
    spec = importlib.util.spec_from_file_location("cn_clip_bert_tokenizer", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.FullTokenizer(vocab_file=str(REPO / "retrieval" / "vocab.txt"))


# --- baselines ---------------------------------------------------------------------------------
def bench_ort_fp32_batch1(model_dir: Path, seconds: float) -> dict[str, tuple[float, float]]:
    """(items/s, p50 ms) per tower: tokenize/preprocess + one fp32 bucket-1 session, one client."""
    import onnxruntime as ort

    manifest = ModelManifest.load(model_dir, verify=False)
    texts, images = text_payloads(), image_payloads()
    out = {}
    for tower in ("text", "image"):
        spec = manifest.towers[tower]
        precision = "fp32" if "fp32" in spec.graphs else spec.precisions()[0]
        options = ort.SessionOptions()
        options.intra_op_num_threads = len(os.sched_getaffinity(0))
        session = ort.InferenceSession(
            str(manifest.graph_path(tower, precision, 1)), options, providers=["CPUExecutionProvider"]
        )
        counter = iter(range(10**9))

        def once(tower=tower, session=session, spec=spec, counter=counter) -> None:
            i = next(counter)
            if tower == "text":
                x = tokenize([texts[i % len(texts)]], manifest.context_length)
            else:
                x = preprocess_image(images[i % len(images)], manifest.image_size)[None]
            session.run([spec.output_name], {spec.input_name: x})

        once()
        calls, elapsed, latencies = time_loop(once, seconds)
        out[tower] = (calls / elapsed, statistics.median(latencies) * 1000)
    return out


Timing = dict[str, tuple[float, float]]  # tower -> (items/s, p50 ms)
ORT_BASELINE = "ORT fp32, batch 1, no batcher"


def torch_runners(model_dir: Path) -> dict[str, list] | None:
    """The PyTorch baselines per tower (built once: cn_clip's twin copies the weights), or None
    when torch is missing or the model has no torch twin (the toy model)."""
    try:
        from benchmarks.torch_baselines import model_config, random_model, torch_baselines
    except ImportError:
        return None
    config = model_config(ModelManifest.load(model_dir, verify=False))
    if config is None:
        return None
    model = random_model(config)
    cores = len(os.sched_getaffinity(0))
    return {tower: torch_baselines(model, tower, cores) for tower in ("text", "image")}


def bench_torch(model_dir: Path, runners: dict[str, list], seconds: float) -> dict[str, Timing]:
    """Each PyTorch baseline like the ORT one: tokenize/preprocess + one batch-1 call, one client."""
    manifest = ModelManifest.load(model_dir, verify=False)
    texts, images = text_payloads(), image_payloads()
    out: dict[str, Timing] = defaultdict(dict)
    for tower in ("text", "image"):
        for baseline in runners[tower]:
            counter = iter(range(10**9))

            def once(tower=tower, run=baseline.run, counter=counter) -> None:
                i = next(counter)
                if tower == "text":
                    run(tokenize([texts[i % len(texts)]], manifest.context_length))
                else:
                    run(preprocess_image(images[i % len(images)], manifest.image_size)[None])

            once()
            calls, elapsed, latencies = time_loop(once, seconds)
            out[baseline.label][tower] = (calls / elapsed, statistics.median(latencies) * 1000)
    return dict(out)


def macs_per_item(model_dir: Path, precision: str) -> dict[str, tuple[str, int]]:
    """Per tower: (the precision the sweep serves, multiply-accumulates per item of its bucket-1 graph)."""
    manifest = ModelManifest.load(model_dir, verify=False)
    out = {}
    for tower in ("text", "image"):
        chosen = choose_precision("cpu", precision, manifest.towers[tower].precisions())
        out[tower] = (chosen, graph_macs(manifest.graph_path(tower, chosen, 1)))
    return out


# --- report ------------------------------------------------------------------------------------
def median_points(runs: list[list[SweepPoint]]) -> list[SweepPoint]:
    grouped: dict[tuple, list[SweepPoint]] = defaultdict(list)
    for run in runs:
        for p in run:
            grouped[(p.tower, p.streams, p.batching, p.concurrency)].append(p)
    out = []
    for (tower, streams, batching, concurrency), ps in grouped.items():
        med = {f: statistics.median(getattr(p, f) for p in ps) for f in ("items_per_s", "p50_ms", "p95_ms", "p99_ms")}
        out.append(
            SweepPoint(
                tower, streams, batching, concurrency, sum(p.items for p in ps), sum(p.seconds for p in ps), **med
            )
        )
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per sweep point")
    parser.add_argument("--baseline-seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", default="1,2,4,8,16")
    parser.add_argument("--configs", default="1:on,1:off,2:on")
    parser.add_argument("--buckets", default="1,4,8,16")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--tokenizer-queries", type=int, default=20_000)
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch baselines")
    parser.add_argument("--no-peak", action="store_true", help="skip the GEMM peak (no %% of peak column)")
    parser.add_argument("--peak-seconds", type=float, default=0.3, help="timed seconds per peak GEMM per repeat")
    parser.add_argument("--peak-shape", type=parse_shape, action="append", help="M,K,N of a peak GEMM (repeatable)")
    parser.add_argument("--min-requests", type=int, default=2, help="requests each client completes per point")
    parser.add_argument("--isolate", action="store_true", help="each encoder config in a fresh process (real models)")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    return parser.parse_args(argv)


def tokenizer_section(queries: int, repeats: int) -> list[str]:
    """The tokenizer table: ours (cold and warm caches) against cn_clip's FullTokenizer."""
    tok = [bench_tokenizer(queries) for _ in range(repeats)]
    med = {k: statistics.median(t[k] for t in tok) for k in tok[0]}
    lines = ["**Tokenizer** (distinct short queries, 2–6 words; queries per CPU-second of one thread):", ""]
    lines += ["| tokenizer | queries/s | vs cn_clip |", "| --- | --- | --- |"]
    ref = med.get("cn_clip_qps")
    for key, label in (
        ("ours_cold_qps", "ours, cold caches"),
        ("ours_warm_qps", "ours, warm"),
        ("cn_clip_qps", "cn_clip FullTokenizer"),
    ):
        if key in med:
            ratio = f"{med[key] / ref:.1f}×" if ref else "–"
            lines.append(f"| {label} | {med[key]:,.0f} | {ratio} |")
    lines.append("")
    return lines


def measure_rounds(
    args: argparse.Namespace, base: Settings, cores: int
) -> tuple[dict[str, list[Timing]], list[list[Peak]], list[list[SweepPoint]]]:
    """Peaks, baselines and the sweep, interleaved per repeat (each repeat sees similar load)."""
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    configs = [(int(s), m == "on") for s, _, m in (c.partition(":") for c in args.configs.split(","))]
    runners = None if args.no_torch else torch_runners(args.model)
    peak_inputs = None if args.no_peak else peak_graphs(args.peak_shape or LAYER_SHAPES)
    baselines: dict[str, list[Timing]] = defaultdict(list)
    round_peaks: list[list[Peak]] = []
    runs: list[list[SweepPoint]] = []
    for repeat in range(args.repeats):
        if peak_inputs is not None:
            round_peaks.append(measure_peaks([cores], 1, args.peak_seconds, peak_inputs))
        ort_fp32 = bench_ort_fp32_batch1(args.model, args.baseline_seconds)
        baselines[ORT_BASELINE].append(ort_fp32)
        print(f"repeat {repeat + 1}: ORT fp32 batch 1 {ort_fp32}", file=sys.stderr, flush=True)
        if runners is not None:
            for label, timing in bench_torch(args.model, runners, args.baseline_seconds).items():
                baselines[label].append(timing)
                print(f"repeat {repeat + 1}: {label} batch 1 {timing}", file=sys.stderr, flush=True)
        runs.append(
            run_sweep(
                args.model, ("text", "image"), concurrencies, configs, args.duration, base,
                min_requests=args.min_requests, isolate=args.isolate,
                on_point=lambda p: print(f"measured: {p.row()}", file=sys.stderr, flush=True),
            )
        )  # fmt: skip
    return baselines, round_peaks, runs


def baselines_section(baselines: dict[str, list[Timing]]) -> tuple[list[str], dict[str, float]]:
    """The baselines table, and the reference rate per tower (the best PyTorch, else ORT fp32)."""
    rates = {name: {t: statistics.median(v[t][0] for v in values) for t in ("text", "image")}
             for name, values in baselines.items()}  # fmt: skip
    torch_names = [name for name in baselines if name != ORT_BASELINE]
    reference: dict[str, str] = {}
    for tower in ("text", "image"):
        reference[tower] = max(torch_names, key=lambda n: rates[n][tower]) if torch_names else ORT_BASELINE
    described = "; ".join(f"{t}: *{reference[t]}*" for t in ("text", "image"))
    lines = [
        f"**Baselines** (one client, batch 1; ratios below are against the best PyTorch per tower — {described}):",
        "",
        "| baseline | text/s (min–max) | text p50 ms | img/s (min–max) | image p50 ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, values in baselines.items():
        cells = []
        for tower in ("text", "image"):
            per_repeat = [v[tower][0] for v in values]
            rate = f"{statistics.median(per_repeat):.1f} ({min(per_repeat):.1f}–{max(per_repeat):.1f})"
            cells += [f"**{rate}**" if reference[tower] == name else rate,
                      f"{statistics.median(v[tower][1] for v in values):.1f}"]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines, {t: rates[reference[t]][t] for t in ("text", "image")}


def sweep_section(
    args: argparse.Namespace, points: list[SweepPoint], peaks: list[Peak], cores: int, ref_rate: dict[str, float]
) -> list[str]:
    """The GEMM peak table (when measured) and the encoder sweep with its ratios and % of peak."""
    lines: list[str] = []
    if peaks:
        lines.append(f"**GEMM peak** (`benchmarks/peak.py`, all {cores} cores, median of the {args.repeats} repeats):")
        lines.append("")
        lines += [*peak_table(peaks), ""]
    work = macs_per_item(args.model, args.precision)
    peak_note = ", ".join(f"{t} {work[t][0]} {work[t][1] / 1e9:.2f} GMAC/item" for t in ("text", "image"))
    lines.append("**Encoder sweep** (`cnclip bench encoders`; closed-loop clients sending one item per request; "
                 f"% of peak on all cores: {peak_note}):")  # fmt: skip
    lines.append("")
    header, separator = TABLE_HEADER.splitlines()
    lines.append(header + " × baseline | % of peak |")
    lines.append(separator + " --- | --- |")
    for p in points:
        precision, macs = work[p.tower]
        peak = peak_for(peaks, precision, cores)
        percent = f"{percent_of_peak(macs, 1 / p.items_per_s, peak.gops):.1f} %" if peak and p.items_per_s else "–"
        lines.append(p.row() + f" {p.items_per_s / ref_rate[p.tower]:.2f}× | {percent} |")
    return lines


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    base = Settings(_env_file=None, model_dir=args.model, precision=args.precision,  # type: ignore[call-arg]
                    buckets=[int(b) for b in args.buckets.split(",")], provider="cpu")  # fmt: skip
    manifest = ModelManifest.load(args.model)
    load_before = [round(v, 2) for v in os.getloadavg()]
    lines = [
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; machine: {machine()}",
        f"- model: `{manifest.name}` ({manifest.arch}, {manifest.embed_dim}-d), buckets {args.buckets}, "
        f"precision {args.precision}; {args.repeats} repeats × {args.duration:g}s per point, medians",
        f"- command: `python benchmarks/bench_encoders.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
    ]
    lines += tokenizer_section(args.tokenizer_queries, args.repeats)
    cores = len(os.sched_getaffinity(0))
    baselines, round_peaks, runs = measure_rounds(args, base, cores)
    lines.insert(1, f"- load average (1/5/15 min) before {load_before}, after {[round(v, 2) for v in os.getloadavg()]}")
    baseline_lines, ref_rate = baselines_section(baselines)
    lines += baseline_lines
    lines += sweep_section(args, median_points(runs), merge_rounds(round_peaks), cores, ref_rate)
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report, encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
