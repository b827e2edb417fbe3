"""Converted graphs vs PyTorch eager: items/s per tower at batch 1 and 8, with parity numbers.

Usage (the model directory comes from `cnclip convert --arch ViT-B-16 --random-init`, whose weights
this script rebuilds from the same seed):

    python benchmarks/bench_convert.py --model-dir /work/bench-models/vit-b-16 --rounds 5

Engines: PyTorch eager fp32 (the baseline), ONNX Runtime fp32 and int8 graphs of the model
directory, and int8 experiments built here from its fp32 graph (`--experiments`): attention
matmuls quantized too, per-tensor weights, and ORT's transformer fusion before quantization.
Rounds are interleaved (every engine once per round) so machine noise hits all alike; each number
is the median over rounds. Parity: the minimum row cosine against eager on the benchmark inputs, and
for int8 variants the top-10 text→image neighbour overlap on a 48-picture gallery.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F

from retrieval.convert.checkpoint import build_model, vary_constant_parameters
from retrieval.convert.export import RAW_OUTPUT_NAMES, tower_module
from retrieval.convert.model import CLIP
from retrieval.convert.parity import cosines, sample_images, sample_texts, topk_overlap
from retrieval.convert.quantize import append_l2_normalize, to_int8
from retrieval.manifest import ModelManifest

Runner = Callable[[np.ndarray], np.ndarray]


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


def eager_runner(model: CLIP, tower: str) -> Runner:
    module = tower_module(model, tower)

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return F.normalize(module(torch.from_numpy(x)), dim=-1).numpy()

    return run


def items_per_second(run: Runner, x: np.ndarray, seconds: float) -> float:
    run(x)  # warm
    count, started = 0, time.perf_counter()
    while True:
        run(x)
        count += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds and count >= 2:
            return count * len(x) / elapsed


def split_unsqueezes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Unsqueeze(axes=[1, 2]) → two single-axis Unsqueezes: the mask pattern ORT's BERT attention fusion expects."""
    from onnx import helper, numpy_helper

    graph = model.graph
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    constants.update(
        {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node if n.op_type == "Constant"}
    )
    nodes = []
    for node in graph.node:
        axes = constants.get(node.input[1]) if node.op_type == "Unsqueeze" and len(node.input) == 2 else None
        if axes is None or axes.size != 2:
            nodes.append(node)
            continue
        first, second = (
            numpy_helper.from_array(np.array([a], dtype=np.int64), f"{node.name}_axis{i}") for i, a in enumerate(axes)
        )
        graph.initializer.extend([first, second])
        middle = f"{node.output[0]}_first"
        nodes.append(helper.make_node("Unsqueeze", [node.input[0], first.name], [middle]))
        nodes.append(helper.make_node("Unsqueeze", [middle, second.name], [node.output[0]]))
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def fused_int8(fp32_graph: Path, tower: str, config: dict, out: Path) -> Path:
    """ORT's transformer optimizer (Attention/LayerNorm/GELU fusion) on the raw graph, then dynamic int8."""
    from onnxruntime.transformers.optimizer import optimize_model

    raw = split_unsqueezes(strip_normalisation(onnx.load(str(fp32_graph)), tower))
    heads = (
        config["text_num_attention_heads"]
        if tower == "text"
        else config["vision_width"] // config.get("vision_head_width", 64)
    )
    hidden = config["text_hidden_size"] if tower == "text" else config["vision_width"]
    raw_path = out / f"{tower}.{fp32_graph.stem}.raw.onnx"
    onnx.save_model(raw, str(raw_path))
    optimized = optimize_model(
        str(raw_path), model_type="bert" if tower == "text" else "vit", num_heads=heads, hidden_size=hidden
    )
    print(f"  fusion {tower}: {optimized.get_fused_operator_statistics()}")
    quantized = to_int8(optimized.model)
    path = out / f"{tower}.{fp32_graph.stem}.fused-int8.onnx"
    onnx.save_model(append_l2_normalize(quantized, RAW_OUTPUT_NAMES[tower], f"{tower}_features"), str(path))
    return path


def strip_normalisation(model: onnx.ModelProto, tower: str) -> onnx.ModelProto:
    """The graph without its final LpNormalization (back to the raw feature output)."""
    graph = model.graph
    last = graph.node[-1]
    assert last.op_type == "LpNormalization", last.op_type
    raw_name = last.input[0]
    graph.node.remove(last)
    out = graph.output[0]
    out.name = raw_name
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name == raw_name:
                node.output[i] = RAW_OUTPUT_NAMES[tower]
    out.name = RAW_OUTPUT_NAMES[tower]
    return model


def static_int8(fp32_graph: Path, tower: str, out: Path, calibration: np.ndarray, batch: int) -> Path:
    """Static QDQ int8 (activations too), calibrated with MinMax on sample inputs of the graph's batch."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    raw_path = out / f"{tower}.b{batch}.raw-static.onnx"
    onnx.save_model(strip_normalisation(onnx.load(str(fp32_graph)), tower), str(raw_path))
    name = "image" if tower == "image" else "text"
    feeds = [{name: calibration[i : i + batch]} for i in range(0, len(calibration) - batch + 1, batch)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(feeds)

        def get_next(self) -> dict | None:
            return next(self.items, None)

    quantized_path = out / f"{tower}.b{batch}.static-q.onnx"
    quantize_static(
        str(raw_path),
        str(quantized_path),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul", "Conv"],
    )
    path = out / f"{tower}.b{batch}.static-int8.onnx"
    quantized = onnx.load(str(quantized_path))
    onnx.save_model(append_l2_normalize(quantized, RAW_OUTPUT_NAMES[tower], f"{tower}_features"), str(path))
    return path


def variant_graph(fp32_graph: Path, tower: str, out: Path, **int8_options: bool) -> Path:
    raw = strip_normalisation(onnx.load(str(fp32_graph)), tower)
    quantized = to_int8(raw, **int8_options)
    suffix = "-".join(k for k, v in int8_options.items() if v is not None)
    path = out / f"{tower}.{fp32_graph.stem}.int8-{suffix}.onnx"
    onnx.save_model(append_l2_normalize(quantized, RAW_OUTPUT_NAMES[tower], f"{tower}_features"), str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.5, help="timed seconds per engine per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="the --seed the model was converted with")
    parser.add_argument("--experiments", action="store_true", help="also build and time the int8 experiments")
    parser.add_argument("--json", type=Path, help="write all numbers here")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    manifest = ModelManifest.load(args.model_dir, verify=False)
    config = manifest.extra["config"]
    torch.manual_seed(args.seed)
    model = vary_constant_parameters(build_model(config))  # as `cnclip convert --random-init` does
    batches = [int(b) for b in args.batches.split(",")]
    images = sample_images(48, manifest.image_size, seed=11)
    texts = sample_texts()
    inputs = {"image": images, "text": texts}
    workdir = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    results: dict[str, dict] = {}
    engines_by_key: dict[tuple[str, int], dict[str, Runner]] = {}
    for tower in ("image", "text"):
        for b in batches:
            engines: dict[str, Runner] = {"eager-fp32": eager_runner(model, tower)}
            for precision in ("fp32", "int8"):
                if b in manifest.towers[tower].graphs.get(precision, {}):
                    path = manifest.graph_path(tower, precision, b)
                    engines[f"ort-{precision}"] = session_runner(path, args.threads)
            if args.experiments:
                fp32 = manifest.graph_path(tower, "fp32", b)
                engines["int8+attn-matmuls"] = session_runner(
                    variant_graph(fp32, tower, workdir, quantize_activation_matmuls=True), args.threads
                )
                engines["int8-per-tensor"] = session_runner(
                    variant_graph(fp32, tower, workdir, per_channel=False), args.threads
                )
                engines["fused+int8"] = session_runner(fused_int8(fp32, tower, config, workdir), args.threads)
                calibration = inputs[tower][8:] if tower == "image" else inputs[tower]
                engines["static-qdq-int8"] = session_runner(
                    static_int8(fp32, tower, workdir, calibration, b), args.threads
                )
            engines_by_key[tower, b] = engines

    for (tower, b), engines in engines_by_key.items():
        x = inputs[tower][:b]
        reference = engines["eager-fp32"](x)
        speeds: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(args.rounds):
            for name, run in engines.items():
                speeds[name].append(items_per_second(run, x, args.seconds))
        row = {}
        base = statistics.median(speeds["eager-fp32"])
        for name, run in engines.items():
            median = statistics.median(speeds[name])
            row[name] = {
                "items_per_s": round(median, 2),
                "vs_eager": round(median / base, 2),
                "min_cosine": float(cosines(run(x), reference).min()),
                "runs": [round(s, 2) for s in speeds[name]],
            }
        results[f"{tower}/b{b}"] = row
        print(f"{tower} b{b}: " + ", ".join(f"{n} {r['items_per_s']:.2f}/s ({r['vs_eager']}x)" for n, r in row.items()))

    # Top-10 text→image overlap against eager, per engine name present for both towers at the largest batch.
    b = max(batches)
    overlap = {}
    eager_img = engines_by_key["image", b]["eager-fp32"]
    eager_txt = engines_by_key["text", b]["eager-fp32"]

    def encode(run: Runner, data: np.ndarray) -> np.ndarray:
        chunks = []
        for start in range(0, len(data), b):
            chunk = data[start : start + b]
            real = len(chunk)
            if real < b:
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], b - real, axis=0)])
            chunks.append(run(chunk)[:real])
        return np.concatenate(chunks)

    ref_img, ref_txt = encode(eager_img, images), encode(eager_txt, texts)
    for name in engines_by_key["image", b]:
        if name != "eager-fp32" and name in engines_by_key["text", b]:
            got_img = encode(engines_by_key["image", b][name], images)
            got_txt = encode(engines_by_key["text", b][name], texts)
            overlap[name] = topk_overlap(ref_txt, ref_img, got_txt, got_img)
    results["top10_overlap_text_to_image"] = overlap
    print("top-10 overlap vs eager:", {k: f"{v:.1%}" for k, v in overlap.items()})
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
