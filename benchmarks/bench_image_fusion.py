"""Does the image tower gain from ORT's transformer fusions? Builds variants of a converted model's
image graphs and times them against the stored ones, interleaved.

    python benchmarks/bench_image_fusion.py --model /work/bench-models/vitb16-v1 --batches 1,8 --rounds 5

Variants (fp32, and int8 made from each fp32 variant by the shipped `to_int8`):
- stored: the model directory's graphs as `cnclip convert` wrote them;
- skln: `onnxruntime.transformers.optimizer.optimize_model(model_type="vit")` on the stored fp32
  graph (SkipLayerNormalization; no Attention: onnxsim's `fuse_qkv` pass merged q/k/v into one
  MatMul + Split, a pattern ORT's attention fusion does not match);
- attn: the merged q/k/v MatMul split back into three, then the same optimizer (Attention fused,
  QAttention after int8).
Prints the op counts offline and after ORT_ENABLE_ALL at load, each variant's minimum row cosine
against the stored graph of its precision, and per-round and median run times.
"""

from __future__ import annotations

import argparse
import collections
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from retrieval.toolchain.convert.quantize import append_l2_normalize, to_int8  # noqa: E402

VARIANTS = ("stored", "skln", "attn")


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(collections.Counter(n.op_type for n in model.graph.node).most_common())


def strip_normalisation(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The graph without its final LpNormalization; returns it and the raw output's name."""
    last = model.graph.node[-1]
    assert last.op_type == "LpNormalization", last.op_type
    raw = last.input[0]
    model.graph.node.remove(last)
    model.graph.output[0].name = raw
    return model, raw


def unsplit_qkv(model: onnx.ModelProto) -> onnx.ModelProto:
    """MatMul(x, W[d, 3d]) → Split(axis=-1) becomes three MatMuls on W's column blocks, in place."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    weights = {t.name: t for t in graph.initializer}
    replaced: dict[str, list[onnx.NodeProto]] = {}
    dropped: set[str] = set()
    for node in graph.node:
        matmul = producer.get(node.input[0]) if node.op_type == "Split" else None
        if matmul is None or matmul.op_type != "MatMul" or matmul.input[1] not in weights or len(node.input) < 2:
            continue
        if node.input[1] not in weights:
            continue
        w = numpy_helper.to_array(weights[matmul.input[1]])
        sizes = numpy_helper.to_array(weights[node.input[1]])
        start, parts = 0, []
        for i, (size, out) in enumerate(zip(sizes, node.output, strict=True)):
            name = f"{matmul.input[1]}_part{i}"
            graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w[:, start : start + size]), name))
            parts.append(helper.make_node("MatMul", [matmul.input[0], name], [out], name=f"{matmul.name}_part{i}"))
            start += int(size)
        replaced[matmul.name] = parts
        dropped.add(node.name)
    nodes = []
    for node in graph.node:
        if node.name in replaced:
            nodes.extend(replaced[node.name])
        elif node.name not in dropped:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input}
    for tensor in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(tensor)
    return model


def fused(model: onnx.ModelProto, heads: int, width: int) -> tuple[onnx.ModelProto, dict[str, int]]:
    from onnxruntime.transformers.optimizer import optimize_model

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    optimized = optimize_model(model, model_type="vit", num_heads=heads, hidden_size=width, opt_level=0)
    out = optimized.model
    if not any(o.domain == "com.microsoft" for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return out, {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}


def build(model_dir: Path, batch: int, out: Path, heads: int, width: int) -> dict[tuple[str, str], Path]:
    paths = {(p, "stored"): model_dir / f"image.{p}.b{batch}.onnx" for p in ("fp32", "int8")}
    for variant in ("skln", "attn"):
        raw, raw_name = strip_normalisation(onnx.load(str(model_dir / f"image.fp32.b{batch}.onnx")))
        model, stats = fused(unsplit_qkv(raw) if variant == "attn" else raw, heads, width)
        print(f"offline b{batch} {variant}: fused {stats}")
        fp32 = onnx.ModelProto()
        fp32.CopyFrom(model)
        for precision, graph in (("int8", to_int8(model)), ("fp32", fp32)):
            name = f"image.{precision}.{variant}.b{batch}.onnx"
            final = append_l2_normalize(graph, raw_name, "image_features")
            onnx.save_model(final, str(out / name), save_as_external_data=True, location=name + ".data")
            paths[precision, variant] = out / name
    return paths


def session(path: Path, threads: int, save_to: Path | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = threads, 1, 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # fair to whichever runs next
    if save_to is not None:
        options.optimized_model_filepath = str(save_to)
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", save_to.name + ".d")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a converted model directory with fp32 and int8 graphs")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory(prefix="image-fusion-") as tmp:
        out = Path(tmp)
        sessions, inputs = {}, {}
        for b in batches:
            inputs[b] = np.random.default_rng(b).standard_normal((b, 3, 224, 224)).astype(np.float32)
            for (precision, variant), path in build(Path(args.model), b, out, args.heads, args.width).items():
                loaded = out / f"loaded.{precision}.{variant}.b{b}.onnx"
                sessions[precision, variant, b] = session(path, args.threads, loaded if b == batches[0] else None)
                if b == batches[0]:
                    counts = op_counts(onnx.load(str(loaded), load_external_data=False))
                    print(f"at load {precision} {variant}: {counts}")
        answers = {k: s.run(None, {"image": inputs[k[2]]})[0] for k, s in sessions.items()}
        for (precision, variant, b), answer in answers.items():
            cosine = float((answer * answers[precision, "stored", b]).sum(axis=1).min())
            print(f"cosine b{b} {precision} {variant} vs stored {precision}: {cosine:.6f}")
        times: dict[tuple[str, str, int], list[float]] = collections.defaultdict(list)
        for r in range(args.rounds):
            keys = list(sessions) if r % 2 == 0 else list(reversed(sessions))
            for _ in range(args.reps):
                for key in keys:
                    start = time.perf_counter()
                    sessions[key].run(None, {"image": inputs[key[2]]})
                    times[key].append(time.perf_counter() - start)
    reps = args.reps
    print(
        "\n| batch | precision | variant | median ms | vs stored | per round vs stored |\n| --- | --- | --- | --- | --- | --- |"
    )
    for b in batches:
        for precision in ("fp32", "int8"):
            base = times[precision, "stored", b]
            for variant in VARIANTS:
                t = times[precision, variant, b]
                rounds = [
                    statistics.median(t[i * reps : (i + 1) * reps]) / statistics.median(base[i * reps : (i + 1) * reps])
                    - 1
                    for i in range(args.rounds)
                ]
                median = statistics.median(t)
                print(
                    f"| {b} | {precision} | {variant} | {median * 1000:.0f} | {median / statistics.median(base) - 1:+.1%} "
                    f"| {' '.join(f'{q:+.0%}' for q in rounds)} |"
                )


if __name__ == "__main__":
    main()
