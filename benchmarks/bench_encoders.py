"""The model runtime's benchmark for BENCHMARKS.md: tokenizer, baselines, and the encoder sweep.

    python benchmarks/bench_encoders.py --model DIR [--repeats 3] [--duration 3] [--out report.md]

In one run, side by side:
1. tokenizer: distinct short queries/s on one core, ours vs cn_clip's FullTokenizer;
2. baselines, batch 1, one client, no batcher: ONNX Runtime fp32 straight on the bucket-1 graph
   and, when torch and `retrieval.convert.model` are importable, PyTorch eager with the same
   architecture (random weights, `torch.set_num_threads(cores)`);
3. `cnclip bench encoders`' sweep (retrieval/bench.py): text and image, concurrency 1–16,
   1 stream with the batcher on and off, 2 streams with it on.
Every figure is the median of `--repeats` runs. Runs on the toy model as a smoke test.
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
from retrieval.bench import TABLE_HEADER, SweepPoint, image_payloads, run_sweep, text_payloads  # noqa: E402
from retrieval.manifest import ModelManifest  # noqa: E402
from retrieval.preprocess import preprocess_image  # noqa: E402
from retrieval.tokenizer import Tokenizer, tokenize  # noqa: E402

RELEASED_ARCHS = ("RN50", "ViT-B-16", "ViT-L-14", "ViT-L-14-336", "ViT-H-14")


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0))
    return f"{platform.machine()}, {cores} cores ({cpu}), load average {os.getloadavg()[0]:.1f} at start"


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


def bench_torch_eager(model_dir: Path, seconds: float) -> dict[str, tuple[float, float]] | None:
    """Same as the ORT baseline with PyTorch eager (random weights), if the convert package is there."""
    manifest = ModelManifest.load(model_dir, verify=False)
    if manifest.arch not in RELEASED_ARCHS:
        return None  # e.g. the toy model: there is no torch twin to time
    try:
        import torch

        from retrieval.convert.model import CLIP, architecture_config
    except ImportError:
        return None
    config = architecture_config(manifest.arch)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model = CLIP.from_config(config).eval()
    texts, images = text_payloads(), image_payloads()
    out = {}
    with torch.inference_mode():
        for tower in ("text", "image"):
            counter = iter(range(10**9))

            def once(tower=tower, counter=counter) -> None:
                i = next(counter)
                if tower == "text":
                    model.encode_text(torch.from_numpy(tokenize([texts[i % len(texts)]], manifest.context_length)))
                else:
                    pixels = preprocess_image(images[i % len(images)], manifest.image_size)[None]
                    model.encode_image(torch.from_numpy(pixels))

            once()
            calls, elapsed, latencies = time_loop(once, seconds)
            out[tower] = (calls / elapsed, statistics.median(latencies) * 1000)
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


def main(argv: list[str] | None = None) -> str:
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
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch eager baseline")
    parser.add_argument("--min-requests", type=int, default=2, help="requests each client completes per point")
    parser.add_argument("--isolate", action="store_true", help="each encoder config in a fresh process (real models)")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    args = parser.parse_args(argv)

    concurrencies = [int(c) for c in args.concurrency.split(",")]
    configs = [(int(s), m == "on") for s, _, m in (c.partition(":") for c in args.configs.split(","))]
    base = Settings(_env_file=None, model_dir=args.model, precision=args.precision,  # type: ignore[call-arg]
                    buckets=[int(b) for b in args.buckets.split(",")], provider="cpu")  # fmt: skip
    manifest = ModelManifest.load(args.model)
    lines = [
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; machine: {machine()}",
        f"- model: `{manifest.name}` ({manifest.arch}, {manifest.embed_dim}-d), buckets {args.buckets}, "
        f"precision {args.precision}; {args.repeats} repeats × {args.duration:g}s per point, medians",
        f"- command: `python benchmarks/bench_encoders.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
    ]

    tok = [bench_tokenizer(args.tokenizer_queries) for _ in range(args.repeats)]
    med = {k: statistics.median(t[k] for t in tok) for k in tok[0]}
    lines.append("**Tokenizer** (distinct short queries, 2–6 words; queries per CPU-second of one thread):")
    lines.append("")
    lines.append("| tokenizer | queries/s | vs cn_clip |")
    lines.append("| --- | --- | --- |")
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

    baselines: dict[str, list[dict[str, tuple[float, float]]]] = defaultdict(list)
    runs: list[list[SweepPoint]] = []
    for repeat in range(args.repeats):  # baselines and sweep interleaved: each repeat sees similar load
        ort_fp32 = bench_ort_fp32_batch1(args.model, args.baseline_seconds)
        baselines["ORT fp32, batch 1, no batcher"].append(ort_fp32)
        print(f"repeat {repeat + 1}: ORT fp32 batch 1 {ort_fp32}", file=sys.stderr, flush=True)
        if not args.no_torch:
            eager = bench_torch_eager(args.model, args.baseline_seconds)
            if eager is not None:
                baselines["PyTorch eager fp32, batch 1"].append(eager)
                print(f"repeat {repeat + 1}: PyTorch eager batch 1 {eager}", file=sys.stderr, flush=True)
        runs.append(
            run_sweep(
                args.model, ("text", "image"), concurrencies, configs, args.duration, base,
                min_requests=args.min_requests, isolate=args.isolate,
                on_point=lambda p: print(f"measured: {p.row()}", file=sys.stderr, flush=True),
            )
        )  # fmt: skip
    points = median_points(runs)

    reference = (
        "PyTorch eager fp32, batch 1" if "PyTorch eager fp32, batch 1" in baselines else "ORT fp32, batch 1, no batcher"
    )
    ref_rate = {t: statistics.median(b[t][0] for b in baselines[reference]) for t in ("text", "image")}
    lines.append(f"**Baselines** (one client; ratios below are against *{reference}*):")
    lines.append("")
    lines.append("| baseline | text/s | text p50 ms | img/s | image p50 ms |")
    lines.append("| --- | --- | --- | --- | --- |")
    for name, values in baselines.items():
        cells = []
        for tower in ("text", "image"):
            cells += [
                f"{statistics.median(v[tower][0] for v in values):.1f}",
                f"{statistics.median(v[tower][1] for v in values):.1f}",
            ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("**Encoder sweep** (`cnclip bench encoders`; closed-loop clients sending one item per request):")
    lines.append("")
    header, separator = TABLE_HEADER.splitlines()
    lines.append(header + " × baseline |")
    lines.append(separator + " --- |")
    for p in points:
        lines.append(p.row() + f" {p.items_per_s / ref_rate[p.tower]:.2f}× |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report, encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
