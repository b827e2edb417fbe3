"""The int8 experiments `benchmarks/bench_convert.py --experiments` times beside the shipped graphs:
fused attention masks, static (calibrated) quantization, graphs without the final normalisation."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from retrieval.toolchain.convert.export import RAW_OUTPUT_NAMES  # noqa: E402
from retrieval.toolchain.convert.quantize import append_l2_normalize, to_int8  # noqa: E402


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
