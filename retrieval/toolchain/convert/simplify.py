"""Graph simplification (seed step 3): fold constant subgraphs, count ops before and after.

onnxsim does the work (constant folding, shape-chain removal, dead-node elimination) on the
fixed-shape graph. Gemm nodes it creates are turned back into MatMul + Add (`gemm_to_matmul`):
ONNX Runtime's dynamic int8 quantizer handles MatMul but not Gemm, and ORT fuses MatMul+Add
itself at load time. When onnxsim
is missing or fails, onnx's own shape inference plus ORT's basic offline optimisation is the
fallback, and the report says so.
"""

from __future__ import annotations

import logging
import tempfile
from collections import Counter
from pathlib import Path

import onnx
from onnx import helper, numpy_helper

from retrieval.errors import ModelError

log = logging.getLogger(__name__)

# Ops that must never survive simplification of a static graph (the seed's per-layer constant Mod).
FORBIDDEN_OPS = ("Mod",)
SKIPPED_ONNXSIM_PASSES = ["fuse_matmul_add_bias_into_gemm", "fuse_matmul_add_bias_into_gemm_batched"]


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Node count per op type of the main graph, most frequent first."""
    counts = Counter(node.op_type for node in model.graph.node)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def gemm_to_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite plain Gemm nodes (constant weight, alpha = beta = 1, no transA) as MatMul + Add, in place."""
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        plain = attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0 and not attrs.get("transA", 0)
        if node.op_type != "Gemm" or not plain or node.input[1] not in weights:
            nodes.append(node)
            continue
        weight_name = node.input[1]
        if attrs.get("transB", 0):
            transposed = numpy_helper.to_array(weights[weight_name]).T.copy()
            weight_name = f"{weight_name}_T"
            if weight_name not in weights:
                weights[weight_name] = numpy_helper.from_array(transposed, weight_name)
                graph.initializer.append(weights[weight_name])
        has_bias = len(node.input) > 2 and node.input[2] != ""
        product = f"{node.output[0]}_matmul" if has_bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], weight_name], [product], name=f"{node.name}_MatMul"))
        if has_bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}_Add"))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    unused = [t for t in graph.initializer if t.name not in used]
    for tensor in unused:
        graph.initializer.remove(tensor)
    return model


def _simplify_with_ort(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="cnclip-simplify-") as tmp:
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save_model(model, str(src))
        options = ort.SessionOptions()
        # Basic level only: constant folding and redundant-node removal, no CPU-specific fused ops.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(dst)
        ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
        return onnx.load(str(dst))


def simplify_graph(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """Simplified copy of `model` and the name of the method used ("onnxsim" or "onnxruntime-basic")."""
    try:
        import onnxsim
    except ImportError:
        onnxsim = None
    method = "onnxsim"
    simplified: onnx.ModelProto | None = None
    if onnxsim is not None:
        try:
            simplified, ok = onnxsim.simplify(model, skipped_optimizers=SKIPPED_ONNXSIM_PASSES)
            simplified = gemm_to_matmul(simplified)
        except (RuntimeError, ValueError, onnx.checker.ValidationError) as exc:
            log.warning("onnxsim failed (%s); falling back to ONNX Runtime's basic optimisation", exc)
            simplified, ok = None, False
        if simplified is not None and not ok:
            log.warning("onnxsim could not validate its result; falling back to ONNX Runtime's basic optimisation")
            simplified = None
    if simplified is None:
        method = "onnxruntime-basic"
        simplified = _simplify_with_ort(model)
    left = [op for op in FORBIDDEN_OPS if any(n.op_type == op for n in simplified.graph.node)]
    if left:
        raise ModelError(f"simplification left {', '.join(left)} nodes in the graph; static graphs must not have them")
    return simplified, method
