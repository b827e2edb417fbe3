"""Side by side: the shipped default against every backend and precision, PyTorch and the GEMM peaks.

    python benchmarks/bench_backends.py --model DIR [--rounds 5] [--seconds 2] [--out report.md]

One run, rounds interleaved (every configuration once per case and round; medians with min–max),
the cases of issue 24: image b1 and b8, text b1 at 16 and 52 tokens, text b16 at 16 tokens.
Configurations (the same graphs and weights, one stream on all cores):
- **shipped**: what runs without a tuning file — ONNX Runtime, its default precision (int8 on CPU when
  the model has it), one shape-dynamic session for all of a tower's shapes, its own prepacked copy;
- **ORT shared**: the same graphs, a session per shape on one shared copy (prepacking off:
  `CNCLIP_DYNAMIC_SHAPES=false`); **ORT prepacked**: a session per shape, each its own prepacked copy;
  **ORT fp32 shared**;
- **OpenVINO int8** (the model's `int8-qdq` graphs, NNCF), **OpenVINO bf16** (where the CPU computes
  bf16), **OpenVINO fp32** (pinned) and **OpenVINO default** (no precision hint: what OpenVINO picks
  by itself, bf16 on AMX/AVX512_BF16 CPUs);
- **tuned** (with `--tuning FILE`, repeatable: `tuned FILE-STEM` each): what `cnclip serve` runs with
  that tuning file — per tower its backend and precision, per shape prepacked or shared — and a last
  column each: tuned ÷ the fastest configuration of the same case (issue 24 asks ≤ 1.10);
- **PyTorch**: the best of `benchmarks/torch_baselines.py`'s five options (when the model has a torch twin):
  eager fp32 on 1 and on all cores, bf16 autocast, cn_clip's own model, dynamic int8; the "best PyTorch"
  cell names the winner, and a second table gives every option per case with its lowest cosine against
  eager fp32 on the gate's parity inputs (what dynamic int8 costs in answers).
GEMM peaks (GOP/s, all cores): ONNX Runtime int8/fp32 (`benchmarks/peak.py`), and through OpenVINO
fp32, bf16 and int8 (an NNCF-quantized GEMM) on the same shapes. Ratios are against *shipped*.
`--rounds 1 --seconds 0.05 --no-torch --no-peak` is a smoke test (tests/retrieval/test_bench_backends.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.peak import LAYER_SHAPES, cpu_flags, graph_macs, matmul_graph, measure_peaks, peak_table  # noqa: E402
from retrieval.backends import BACKENDS, DEFAULT_BACKEND, backend_named  # noqa: E402
from retrieval.manifest import ModelManifest  # noqa: E402
from retrieval.sessions import dummy_batch  # noqa: E402
from retrieval.toolchain.gate import Candidate, parity_images, parity_texts  # noqa: E402
from retrieval.toolchain.tune.measure import Config, open_config, shapes_of, time_calls  # noqa: E402

CASES = (("image", 1, None), ("image", 8, None), ("text", 1, 16), ("text", 1, 52), ("text", 16, 16))
Runner = Callable[[np.ndarray], object]


def case_label(tower: str, bucket: int, length: int | None) -> str:
    return f"{tower} b{bucket}" + (f", {length} tokens" if length else "")


def configurations(manifest: ModelManifest) -> list[tuple[str, Candidate, str]]:
    """(label, candidate, weights mode) of every configuration this machine and model can run."""
    ort = DEFAULT_BACKEND
    shipped = next(iter(ort.precisions("cpu", manifest.towers["text"].precisions())))
    out = [
        ("shipped", Candidate(ort, "cpu", shipped, shipped), "dynamic"),
        (f"ORT {shipped} shared", Candidate(ort, "cpu", shipped, shipped), "shared"),
        (f"ORT {shipped} prepacked", Candidate(ort, "cpu", shipped, shipped), "prepacked"),
    ]
    if shipped != "fp32":
        out.append(("ORT fp32 shared", Candidate(ort, "cpu", "fp32", "fp32"), "shared"))
    ov = backend_named("openvino")
    if ov.detect().found:
        offered = ov.precisions("CPU", manifest.towers["text"].precisions())
        for precision in ("int8", "bf16", "fp32"):
            if precision in offered:
                out.append((f"OpenVINO {precision}", Candidate(ov, "CPU", precision, offered[precision]), "own"))
        out.append(("OpenVINO default", Candidate(ov, "CPU", "default", "fp32"), "own"))
    return out


def tuned_configurations(
    manifest: ModelManifest, path: Path
) -> dict[tuple[str, int, int | None], tuple[Candidate, str]]:
    """The tuning file's (candidate, weights mode) for each case."""
    from retrieval.tuning import TuningFile

    tuning = TuningFile.model_validate_json(path.read_text(encoding="utf-8"))
    out = {}
    for case in CASES:
        tower, bucket, length = case
        choice = tuning.towers[tower]  # type: ignore[index]
        backend = backend_named(choice.backend)
        graph = backend.precisions(choice.device, manifest.towers[tower].precisions())[choice.precision]
        full = length if length and length < manifest.context_length else None
        if choice.one_session() and backend.dynamic_sessions(choice.device):
            mode = "dynamic"
        elif (bucket, full) in choice.prepacked():
            mode = "prepacked"
        else:
            mode = "shared" if backend.shares_weights(choice.device) else "own"
        out[case] = (Candidate(backend, choice.device, choice.precision, graph), mode)
    return out


def _tuned_label(path: Path, paths: list[Path]) -> str:
    return "tuned" if len(paths) == 1 else f"tuned {path.stem}"


def open_runner(
    manifest: ModelManifest, case: tuple[str, int, int | None], label: str, candidate: Candidate, mode: str
) -> Runner | None:
    tower, bucket, length = case
    full = length if length and length < manifest.context_length else None
    try:
        manifest.graph_path(tower, candidate.graph, bucket, full)
    except (KeyError, Exception):  # this model has no graph of that shape or variant
        return None
    if candidate.precision == "default":  # OpenVINO with no precision hint of ours
        return _openvino_default(manifest, tower, candidate.graph, bucket, full)
    # The one shape-dynamic session is one graph for all of the tower's shapes: open them all, as serve does.
    shapes = shapes_of(manifest, tower, candidate.graph, ()) if mode == "dynamic" else [(bucket, full)]
    sessions = open_config(manifest, tower, Config(candidate, mode), shapes, sorted(os.sched_getaffinity(0)))
    return sessions[bucket, full].run


def _openvino_default(manifest: ModelManifest, tower: str, graph: str, bucket: int, length: int | None) -> Runner:
    from retrieval.backends.openvino import _core

    compiled = _core().compile_model(
        str(manifest.graph_path(tower, graph, bucket, length)), "CPU", {"PERFORMANCE_HINT": "LATENCY"}
    )
    request = compiled.create_infer_request()
    print(
        f"OpenVINO default for {tower}: {compiled.get_property('INFERENCE_PRECISION_HINT').get_type_name()}",
        file=sys.stderr,
    )
    return lambda batch: request.infer({0: batch})


def torch_runner(manifest: ModelManifest, tower: str) -> list[tuple[str, Runner, float]] | None:
    """(label, runner, min cosine vs eager fp32) of the five PyTorch options; the fastest is chosen per
    case after timing them all. The cosine is on the gate's parity inputs (24 sentences, 8 pictures)."""
    try:
        from benchmarks.torch_baselines import cosines_vs_eager, model_config, random_model, torch_baselines
    except ImportError:
        return None
    config = model_config(manifest)
    if config is None:
        return None
    baselines = torch_baselines(random_model(config), tower, len(os.sched_getaffinity(0)))
    x = parity_images(8, manifest.image_size) if tower == "image" else parity_texts(manifest.context_length)
    cosine = cosines_vs_eager(baselines, x)
    return [(b.label, b.run, cosine[b.key]) for b in baselines]


def openvino_peaks(seconds: float) -> list[str]:
    """GOP/s of the peak GEMMs through OpenVINO fp32, bf16 (where native) and int8 (NNCF)."""
    ov = backend_named("openvino")
    if not ov.detect().found:
        return ["OpenVINO: not installed"]
    from retrieval.backends.openvino import _core, capabilities

    lines = []
    for m, k, n in LAYER_SHAPES:
        fp32 = matmul_graph(m, k, n)
        graphs = {"fp32": (fp32, "f32")}
        if "BF16" in capabilities("CPU"):
            graphs["bf16"] = (fp32, "bf16")
        try:
            from retrieval.toolchain.convert.openvino_int8 import to_int8_qdq

            x = np.random.default_rng(0).standard_normal((4 * m, k), dtype=np.float32)
            graphs["int8"] = (to_int8_qdq(fp32, x, []), "f32")
        except ImportError:
            pass
        x = np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)
        for precision, (graph, hint) in graphs.items():
            compiled = _core().compile_model(
                _core().read_model(graph.SerializeToString(), b""), "CPU", {"INFERENCE_PRECISION_HINT": hint}
            )
            request = compiled.create_infer_request()
            ms = time_calls(partial(request.infer, {0: x}), seconds)
            lines.append(
                f"| OpenVINO {precision} | [{m}×{k}]·[{k}×{n}] | {2 * graph_macs(fp32) / (ms / 1000) / 1e9:,.0f} |"
            )
    return ["| GEMM through | shape | GOP/s |", "| --- | --- | --- |", *lines]


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per configuration, case and round")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-peak", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--tuning", type=Path, action="append", default=[], help="a tuning file: adds a tuned column (repeatable)"
    )
    args = parser.parse_args(argv)
    manifest = ModelManifest.load(args.model)
    load_before = os.getloadavg()[0]
    runners: dict[tuple[str, str], Runner] = {}
    torch_cosines: dict[tuple[str, str], float] = {}  # (tower, label) -> min cosine vs eager fp32
    configs = configurations(manifest)
    tuned = {_tuned_label(p, args.tuning): tuned_configurations(manifest, p) for p in args.tuning}
    for case in CASES:
        for label, candidate, mode in configs + [(lb, *by_case[case]) for lb, by_case in tuned.items()]:
            runner = open_runner(manifest, case, label, candidate, mode)
            if runner is not None:
                runners[case_label(*case), label] = runner
        if not args.no_torch and (options := torch_runner(manifest, case[0])):
            for label, run, cosine in options:
                runners[case_label(*case), f"PyTorch: {label}"] = run
                torch_cosines[case[0], f"PyTorch: {label}"] = cosine
    samples: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds):
        for case in CASES:
            batch = dummy_batch(case[0], case[1], manifest.image_size, case[2] or manifest.context_length)
            for (name, label), run in runners.items():
                if name == case_label(*case):
                    samples.setdefault((name, label), []).append(time_calls(partial(run, batch), args.seconds))
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    report = _report(args, manifest, samples, load_before, torch_cosines)
    print(report)
    if args.out:
        args.out.write_text(report, encoding="utf-8")
    return report


def _report(
    args: argparse.Namespace,
    manifest: ModelManifest,
    samples: dict[tuple[str, str], list[float]],
    load_before: float,
    torch_cosines: dict[tuple[str, str], float],
) -> str:
    labels = list(dict.fromkeys(label for _, label in samples if not label.startswith("PyTorch")))
    tuned = [_tuned_label(p, args.tuning) for p in args.tuning]
    lines = [
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {len(os.sched_getaffinity(0))} cores; CPU {cpu_flags()}",
        f"- load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; model {manifest.name} ({manifest.arch});"
        f" engines {', '.join(f'{b.name} {b.version()}' for b in BACKENDS if b.version())}",
        f"- {args.rounds} interleaved rounds × {args.seconds:g} s; ms per run, median (min–max), × shipped",
        "",
        "| case | " + " | ".join(labels) + " | best PyTorch |" + "".join(f" {lb} ÷ fastest |" for lb in tuned),
        "| --- |" + " --- |" * (len(labels) + 1 + len(tuned)),
    ]
    for case in CASES:
        name = case_label(*case)
        shipped = samples.get((name, "shipped"))
        cells = []
        for label in [*labels, None]:
            if label is None:
                torch = {lb: v for (n, lb), v in samples.items() if n == name and lb.startswith("PyTorch")}
                label = min(torch, key=lambda lb: statistics.median(torch[lb])) if torch else None
            values = samples.get((name, label)) if label else None
            if not values or label is None:
                cells.append("–")
                continue
            med = statistics.median(values)
            ratio = f", {statistics.median(shipped) / med:.2f}×" if shipped else ""
            winner = f" {label.removeprefix('PyTorch: ')}" if label.startswith("PyTorch") else ""
            cells.append(f"{med:.2f} ({min(values):.2f}–{max(values):.2f}){ratio}{winner}")
        medians = {lb: statistics.median(v) for (n, lb), v in samples.items() if n == name}
        fastest = min(medians, key=lambda lb: medians[lb]) if medians else ""
        for lb in tuned:
            cells.append(f"{medians[lb] / medians[fastest]:.2f} (fastest: {fastest})" if lb in medians else "–")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += _torch_table(samples, torch_cosines)
    if not args.no_peak:
        lines += [
            "",
            *peak_table(measure_peaks(repeats=args.rounds, min_seconds=args.seconds / 4)),
            "",
            *openvino_peaks(args.seconds / 4),
        ]
    return "\n".join(lines) + "\n"


def _torch_table(samples: dict[tuple[str, str], list[float]], torch_cosines: dict[tuple[str, str], float]) -> list[str]:
    """Every PyTorch option per case: ms per run, × shipped, and its lowest cosine against eager fp32."""
    if not torch_cosines:
        return []
    lines = [
        "",
        "| case | PyTorch option | ms per run | × shipped | min cosine vs eager fp32 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for case in CASES:
        name = case_label(*case)
        shipped = samples.get((name, "shipped"))
        for (tower, label), cosine in torch_cosines.items():
            values = samples.get((name, label))
            if tower != case[0] or not values:
                continue
            med = statistics.median(values)
            ratio = f"{statistics.median(shipped) / med:.2f}×" if shipped else "–"
            lines.append(f"| {name} | {label.removeprefix('PyTorch: ')} | {med:.2f} | {ratio} | {cosine:.5f} |")
    return lines


if __name__ == "__main__":
    main()
