"""The machine's GEMM peak, measured, and the multiply-accumulates of a graph: the "% of peak" column.

    python benchmarks/peak.py [--threads 1,2] [--repeats 5] [--graph MODEL_DIR/image.int8.b8.onnx ...]

- int8 peak: one GEMM the way our int8 graphs run it. An fp32 `MatMul` with a constant weight is put
  through `retrieval.toolchain.convert.quantize.to_int8` (DynamicQuantizeLinear + MatMulInteger + scale, which
  ONNX Runtime fuses into DynamicQuantizeMatMul at load) and timed in ONNX Runtime with the server's
  session options (`retrieval.backends.onnxruntime.ort_session_options`). The time includes quantizing the activations,
  as in the real graphs. Shapes are those of a ViT-B/BERT-base layer's MLP ([M, 768] × [768, 3072]
  and [M, 3072] × [3072, 768]); the peak is the best of them.
- fp32 peak: the same GEMMs as plain fp32 MatMuls in ONNX Runtime (MLAS, what the fp32 graphs use)
  and a large square `torch.matmul` (oneDNN/MKL); the peak is the best of all of them.

Rates are GOP/s with one multiply-accumulate = 2 operations, the median of `repeats` timed runs,
for each thread count (default: 1 and all cores of this process). `graph_macs` counts one run of a
fixed-shape graph (MatMul, MatMulInteger, Gemm, Conv, ConvInteger and ONNX Runtime's fused matmuls)
from ONNX shape inference, so `% of peak = 2 · macs / seconds_per_run / peak_ops`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# [M, K, N]: a transformer layer's MLP GEMMs with M = tokens in the batch (8 × 197 image tokens ≈ 1576).
LAYER_SHAPES: tuple[tuple[int, int, int], ...] = ((2048, 768, 3072), (2048, 3072, 768))
SQUARE = 2048
MATMUL_OPS = {"MatMul", "MatMulInteger", "FusedMatMul", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
GEMM_OPS = {"Gemm", "QGemm"}
CONV_OPS = {"Conv", "ConvInteger", "FusedConv", "QLinearConv"}


# --- multiply-accumulates of a graph ---------------------------------------------------------------
def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Static shapes of every tensor shape inference can tell (initializers, inputs, intermediates)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes: dict[str, list[int]] = {}
    graph = inferred.graph
    for value in (*graph.input, *graph.value_info, *graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    for tensor in graph.initializer:
        shapes[tensor.name] = list(tensor.dims)
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            shapes[node.output[0]] = list(node.attribute[0].t.dims)
    return shapes


def _attribute(node: onnx.NodeProto, name: str, default: int = 0) -> int:
    return next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == name), default)


def _node_macs(node: onnx.NodeProto, shapes: dict[str, list[int]]) -> int:
    def shape(name: str) -> list[int]:
        if name not in shapes:
            raise ValueError(f"{node.op_type} node {node.name!r}: no static shape for {name!r}")
        return shapes[name]

    if node.op_type in MATMUL_OPS:
        a, b = list(shape(node.input[0])), list(shape(node.input[1]))
        if _attribute(node, "transA"):
            a[-2:] = a[-1:-3:-1]
        if _attribute(node, "transB"):
            b[-2:] = b[-1:-3:-1]
        a = [1, *a] if len(a) == 1 else a
        b = [*b, 1] if len(b) == 1 else b
        batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
        return int(np.prod(batch, dtype=np.int64)) * a[-2] * a[-1] * b[-1]
    if node.op_type in GEMM_OPS:
        a, b = shape(node.input[0]), shape(node.input[3 if node.op_type == "QGemm" else 1])
        m, k = (a[1], a[0]) if _attribute(node, "transA") else (a[0], a[1])
        n = b[0] if _attribute(node, "transB") else b[1]
        return m * k * n
    if node.op_type in CONV_OPS:
        weight = shape(node.input[3 if node.op_type == "QLinearConv" else 1])  # [C_out, C_in / group, *kernel]
        out = shape(node.output[0])  # [N, C_out, *spatial]
        return int(np.prod(out, dtype=np.int64)) * int(np.prod(weight[1:], dtype=np.int64))
    return 0


def graph_macs_by_op(model: onnx.ModelProto | str | Path) -> dict[str, int]:
    """Multiply-accumulates of one run of a fixed-shape graph, per op type (only ops that have any).

    A path is loaded without its external data: shapes are all that is needed. Count the saved graph;
    ONNX Runtime's fusions at load time regroup ops but do not change the arithmetic.
    """
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    shapes = _shapes(model)
    totals: dict[str, int] = {}
    for node in model.graph.node:
        macs = _node_macs(node, shapes)
        if macs:
            totals[node.op_type] = totals.get(node.op_type, 0) + macs
    return totals


def graph_macs(model: onnx.ModelProto | str | Path) -> int:
    """Multiply-accumulates of one run of a fixed-shape graph (see `graph_macs_by_op`)."""
    return sum(graph_macs_by_op(model).values())


def percent_of_peak(macs: int, seconds_per_run: float, peak_gops: float) -> float:
    """How much of the peak one run reaches: 2 · macs / seconds / peak, in %."""
    return 100.0 * 2 * macs / seconds_per_run / (peak_gops * 1e9)


# --- measured peaks ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rate:
    """One measured GEMM: what, with how many threads, GOP/s per run (median first)."""

    source: str
    threads: int
    gops: float
    runs: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Peak:
    """The best rate per precision and thread count, with every rate it was chosen from."""

    precision: str
    threads: int
    gops: float
    source: str
    rates: list[Rate]

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def matmul_graph(m: int, k: int, n: int, seed: int = 0) -> onnx.ModelProto:
    """`y = x @ W` with x float32 [m, k] and a random constant W [k, n]: one transformer GEMM."""
    weight = np.random.default_rng(seed).standard_normal((k, n), dtype=np.float32) * k**-0.5
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(weight, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _median_gops(run: Callable[[], object], macs: int, repeats: int, min_seconds: float) -> list[float]:
    """`repeats` samples of GOP/s, each over back-to-back calls lasting at least `min_seconds`."""
    run()  # warm-up: ORT's first run allocates, oneDNN picks its kernel
    samples = []
    for _ in range(repeats):
        calls, started = 0, time.perf_counter()
        while True:
            run()
            calls += 1
            elapsed = time.perf_counter() - started
            if elapsed >= min_seconds:
                break
        samples.append(2 * macs * calls / elapsed / 1e9)
    return samples


def _ort_rate(model: onnx.ModelProto, source: str, threads: int, repeats: int, min_seconds: float, spin: bool) -> Rate:
    import onnxruntime as ort

    from retrieval.backends.base import SessionConfig
    from retrieval.backends.onnxruntime import ort_session_options

    options = ort_session_options(SessionConfig("cpu", "fp32", cores=list(range(threads)), spin=spin))
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    m, k = (d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    x = np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)
    samples = _median_gops(lambda: session.run(None, {"x": x}), graph_macs(model), repeats, min_seconds)
    return Rate(source, threads, statistics.median(samples), [round(s, 1) for s in samples])


def _torch_rate(threads: int, repeats: int, min_seconds: float, size: int = SQUARE) -> Rate | None:
    try:
        import torch
    except ImportError:
        return None
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        samples = _median_gops(lambda: torch.matmul(a, b), size**3, repeats, min_seconds)
    finally:
        torch.set_num_threads(previous)
    return Rate(f"torch matmul {size}³", threads, statistics.median(samples), [round(s, 1) for s in samples])


def peak_graphs(
    shapes: Sequence[tuple[int, int, int]] = LAYER_SHAPES,
) -> list[tuple[str, onnx.ModelProto, onnx.ModelProto]]:
    """(label, fp32 graph, int8 graph) per GEMM shape; the int8 one made by the project's own quantizer."""
    from retrieval.toolchain.convert.quantize import to_int8

    graphs = []
    for m, k, n in shapes:
        fp32 = matmul_graph(m, k, n)
        # keep_output_projection=False: this MatMul's output *is* the graph output, and it must be quantized.
        graphs.append((f"[{m}×{k}]·[{k}×{n}]", fp32, to_int8(fp32, keep_output_projection=False)))
    return graphs


def measure_peaks(
    threads: Sequence[int] | None = None,
    repeats: int = 5,
    min_seconds: float = 0.2,
    graphs: Sequence[tuple[str, onnx.ModelProto, onnx.ModelProto]] | None = None,
    spin: bool = True,
    with_torch: bool = True,
) -> list[Peak]:
    """int8 and fp32 GEMM peaks for each thread count (default: 1 and all cores of this process).

    `graphs` from `peak_graphs` (built once when measuring every round; quantizing takes seconds).
    """
    cores = len(os.sched_getaffinity(0))
    counts = sorted(set(threads or (1, cores)))
    graphs = graphs if graphs is not None else peak_graphs()
    peaks = []
    for count in counts:
        by_precision: dict[str, list[Rate]] = {"int8": [], "fp32": []}
        for label, fp32, int8 in graphs:
            by_precision["int8"].append(_ort_rate(int8, f"ORT int8 {label}", count, repeats, min_seconds, spin))
            by_precision["fp32"].append(_ort_rate(fp32, f"ORT fp32 {label}", count, repeats, min_seconds, spin))
        if with_torch and (rate := _torch_rate(count, repeats, min_seconds)) is not None:
            by_precision["fp32"].append(rate)
        for precision, rates in by_precision.items():
            best = max(rates, key=lambda r: r.gops)
            peaks.append(Peak(precision, count, round(best.gops, 1), best.source, rates))
    return peaks


def merge_rounds(rounds: Sequence[Sequence[Peak]]) -> list[Peak]:
    """Peaks measured once per interleaved round → one list: each source's median over the rounds
    (its `runs` are the per-round values), and per precision and thread count the best source."""
    samples: dict[tuple[str, int, str], list[float]] = {}
    for peaks in rounds:
        for p in peaks:
            for r in p.rates:
                samples.setdefault((p.precision, p.threads, r.source), []).append(r.gops)
    merged: dict[tuple[str, int], list[Rate]] = {}
    for (precision, threads, source), values in samples.items():
        rate = Rate(source, threads, statistics.median(values), [round(v, 1) for v in values])
        merged.setdefault((precision, threads), []).append(rate)
    out = []
    for (precision, threads), rates in merged.items():
        best = max(rates, key=lambda r: r.gops)
        out.append(Peak(precision, threads, round(best.gops, 1), best.source, rates))
    return out


def peak_for(peaks: Sequence[Peak], precision: str, threads: int) -> Peak | None:
    """The measured peak of `precision` at `threads` threads, if it was measured."""
    return next((p for p in peaks if p.precision == precision and p.threads == threads), None)


def parse_shape(text: str) -> tuple[int, int, int]:
    """ "M,K,N" → (M, K, N): a command-line GEMM shape."""
    m, k, n = (int(v) for v in text.split(","))
    return m, k, n


def cpu_flags() -> str:
    """The SIMD features that decide the GEMM kernels (x86: AVX2, AVX-512, VNNI, AMX), from /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown (no /proc/cpuinfo)"
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    flags = set(line.partition(":")[2].split())
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "amx_bf16", "asimddp")
    present = [f for f in wanted if f in flags]
    absent = [f for f in wanted if f not in flags and not f.startswith("asimd")]
    return f"has {' '.join(present) or 'none of them'}; lacks {' '.join(absent) or 'nothing listed'}"


def peak_table(peaks: Sequence[Peak]) -> list[str]:
    """Markdown rows: one per precision and thread count, the best source named."""
    lines = ["| GEMM peak | threads | GOP/s (median) | best of | runs |", "| --- | --- | --- | --- | --- |"]
    for p in peaks:
        best = next(r for r in p.rates if r.source == p.source)
        runs = ", ".join(f"{r:.0f}" for r in best.runs)
        lines.append(f"| {p.precision} | {p.threads} | {p.gops:,.0f} | {p.source} | {runs} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", help="comma-separated thread counts (default: 1 and all cores)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-seconds", type=float, default=0.2, help="timed seconds per sample")
    parser.add_argument("--no-spin", action="store_true", help="ORT threads sleep when idle (several sessions)")
    parser.add_argument("--shape", type=parse_shape, action="append", help="M,K,N of a GEMM (repeatable)")
    parser.add_argument("--graph", type=Path, action="append", default=[], help="also print this graph's MACs")
    parser.add_argument("--json", type=Path, help="write the peaks here")
    args = parser.parse_args(argv)

    threads = [int(t) for t in args.threads.split(",")] if args.threads else None
    print(f"CPU: {cpu_flags()}; load average {os.getloadavg()[0]:.2f} at start")
    graphs = peak_graphs(args.shape or LAYER_SHAPES)
    peaks = measure_peaks(threads, args.repeats, args.min_seconds, graphs, spin=not args.no_spin)
    print("\n".join(peak_table(peaks)))
    for p in peaks:
        others = ", ".join(f"{r.source} {r.gops:,.0f}" for r in p.rates)
        print(f"  {p.precision} × {p.threads}: {others}")
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    for path in args.graph:
        by_op = graph_macs_by_op(path)
        detail = ", ".join(f"{op} {macs / 1e9:.2f}" for op, macs in sorted(by_op.items()))
        print(f"{path.name}: {sum(by_op.values()) / 1e9:.2f} GMAC per run ({detail})")
    if args.json:
        args.json.write_text(json.dumps([p.to_json() for p in peaks], indent=2) + "\n")


if __name__ == "__main__":
    main()
