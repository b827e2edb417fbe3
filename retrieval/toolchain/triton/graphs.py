"""The tower graphs of a Triton repository: a bucket graph loaded whole, its tensors renamed, and
its batch dimension made dynamic (checked numerically against the bucket graph).

Used by `retrieval/toolchain/triton/export.py` (`cnclip export-triton`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from retrieval.errors import ModelError
from retrieval.manifest import ModelManifest


def load_graph(
    manifest: ModelManifest, tower: str, precision: str, bucket: int, length: int | None = None
) -> onnx.ModelProto:
    # onnx.load pulls the shared external-data file in, so the written model.onnx is self-contained.
    return onnx.load(str(manifest.graph_path(tower, precision, bucket, length)))


def rename_io(model: onnx.ModelProto, old: str, new: str) -> None:
    if old == new:
        return
    for node in model.graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        node.output[:] = [new if name == old else name for name in node.output]
    for value in [*model.graph.input, *model.graph.output]:
        if value.name == old:
            value.name = new


_ELEMENTWISE = {"Add", "Sub", "Mul", "Div"}


def _relax_batch(model: onnx.ModelProto, bucket: int) -> onnx.ModelProto:
    """A copy of a fixed-shape bucket graph with a symbolic batch dimension.

    A static export (and onnxsim's constant folding after it) bakes the batch into the graph in
    three ways, each undone here; `dynamic_batch_graph` checks the result numerically:
    - Reshape targets `[b, 197, 768]` or `[b*197, 768]`: the element that is a multiple of b → -1
      (or a leading b → 0, "copy the input's dimension", when the target already has its -1);
    - a folded constant repeated b times, e.g. ViT's class token `[b, 1, w]` feeding a Concat: one
      row expanded to the input's batch at run time;
    - the same repeated constant in Add/Sub/Mul/Div: one row, left to broadcasting.
    """
    relaxed = onnx.ModelProto()
    relaxed.CopyFrom(model)
    graph = relaxed.graph
    for value in [*graph.input, *graph.output]:
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    # Intermediate shapes recorded for the fixed batch would contradict the new one.
    del graph.value_info[:]
    if bucket == 1:
        return relaxed
    constants = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    new_nodes: list[tuple[int, list[onnx.NodeProto]]] = []
    for position, node in enumerate(graph.node):
        if node.op_type == "Reshape" and node.input[1] in constants:
            _relax_reshape(constants[node.input[1]], bucket)
        elif node.op_type in _ELEMENTWISE | {"Concat"}:
            new_nodes += [(position, nodes) for nodes in _one_row_constants(graph, node, constants, bucket)]
    for position, nodes in reversed(new_nodes):  # insert before their consumer, keeping topological order
        for offset, extra in enumerate(nodes):
            graph.node.insert(position + offset, extra)
    return relaxed


def _relax_reshape(tensor: onnx.TensorProto, bucket: int) -> None:
    """A Reshape target with the batch baked in: the multiple of the batch becomes -1 (or a leading
    batch 0, when the target already has its -1)."""
    shape = onnx.numpy_helper.to_array(tensor).astype(np.int64)
    multiples = [i for i, v in enumerate(shape.tolist()) if v >= bucket and v % bucket == 0]
    if shape.ndim == 1 and multiples and -1 not in shape.tolist():
        shape[multiples[0]] = -1
    elif shape.ndim == 1 and shape.size and shape[0] == bucket:
        shape[0] = 0  # already has its -1 ([b, 64, -1]): 0 copies the input's (batch) dimension
    tensor.CopyFrom(onnx.numpy_helper.from_array(shape, tensor.name))


def _one_row_constants(
    graph: onnx.GraphProto, node: onnx.NodeProto, constants: dict[str, onnx.TensorProto], bucket: int
) -> list[list[onnx.NodeProto]]:
    """Replace the constant inputs of `node` that repeat one row `bucket` times by that row: left to
    broadcasting in Add/Sub/Mul/Div, expanded to the batch at run time in a Concat. Returns the nodes
    to insert before `node` (one list per expanded input)."""
    inserted: list[list[onnx.NodeProto]] = []
    for slot, name in enumerate(node.input):
        if name not in constants:
            continue
        array = onnx.numpy_helper.to_array(constants[name])
        if array.ndim < 2 or array.shape[0] != bucket or not np.array_equal(array, np.repeat(array[:1], bucket, 0)):
            continue
        row_name = f"{name}__row"
        if row_name not in constants:
            row = onnx.numpy_helper.from_array(np.ascontiguousarray(array[:1]), row_name)
            graph.initializer.append(row)
            constants[row_name] = row
        if node.op_type in _ELEMENTWISE:
            node.input[slot] = row_name
            continue
        # Concat: expand the row to the batch of the first non-constant input.
        batch_source = next((i for i in node.input if i not in constants), None)
        if batch_source is None:
            continue
        prefix = f"{node.name or name}__batch"
        rest = onnx.numpy_helper.from_array(np.array(array.shape[1:], np.int64), f"{prefix}_rest")
        graph.initializer.append(rest)
        inserted.append(
            [
                onnx.helper.make_node("Shape", [batch_source], [f"{prefix}_shape"], start=0, end=1),
                onnx.helper.make_node("Concat", [f"{prefix}_shape", rest.name], [f"{prefix}_dims"], axis=0),
                onnx.helper.make_node("Expand", [row_name, f"{prefix}_dims"], [f"{prefix}_value"]),
            ]
        )
        node.input[slot] = f"{prefix}_value"
    return inserted


def _sample_inputs(tower: str, model: onnx.ModelProto, rows: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    if tower == "text":
        from retrieval.tokenizer import tokenize

        texts = ["穿红色裙子的女孩", "一只猫", "a dog 在草地上", "汽车", "城市夜景", "海边的日落", "苹果", "book"]
        length = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
        return tokenize([texts[i % len(texts)] for i in range(rows)], length)
    elem = model.graph.input[0].type.tensor_type.elem_type
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][1:]
    dtype = np.float16 if elem == onnx.TensorProto.FLOAT16 else np.float32
    return rng.standard_normal((rows, *dims)).astype(dtype)


def _rows_agree(got: np.ndarray, expected: np.ndarray, atol: float, min_cosine: float | None) -> bool:
    if min_cosine is None:
        return bool(np.allclose(got, expected, atol=atol))
    return bool(((got * expected).sum(axis=1) >= min_cosine).all())


def dynamic_batch_graph(
    manifest: ModelManifest,
    tower: str,
    precision: str,
    batch_sizes: Sequence[int] = (1, 2, 3, 5),
    length: int | None = None,
) -> tuple[onnx.ModelProto, int]:
    """The tower's graph with a dynamic batch dimension, and the bucket it came from.

    Every candidate is checked with ONNX Runtime: at each of `batch_sizes` its rows must equal the
    bucket graph's rows for the same inputs, so a batch size baked into the graph cannot slip through.
    """
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    _ORT_ERRORS = (ort_state.Fail, ort_state.InvalidArgument, ort_state.InvalidGraph, ort_state.RuntimeException)
    buckets = manifest.towers[tower].buckets(precision)
    # Largest first: a large batch is least likely to coincide with a model dimension (1 is everywhere).
    candidates = sorted(buckets, key=lambda b: (b == 1, -b))
    tolerance = 1e-4 if precision == "fp32" else 5e-3
    # Dynamically quantised (int8) graphs scale activations per batch, so a row moves slightly with
    # its batch-mates even in the bucket graph itself; for them the check is the cosine of each row.
    min_cosine = 0.995 if precision == "int8" else None
    options = ort.SessionOptions()
    options.log_severity_level = 4  # a failing candidate is expected; the reason goes into our error
    failures = []
    for bucket in candidates:
        fixed = load_graph(manifest, tower, precision, bucket, length)
        relaxed = _relax_batch(fixed, bucket)
        input_name = fixed.graph.input[0].name
        try:
            reference = ort.InferenceSession(fixed.SerializeToString(), options, providers=["CPUExecutionProvider"])
            candidate = ort.InferenceSession(relaxed.SerializeToString(), options, providers=["CPUExecutionProvider"])
            rows = bucket * -(-max(batch_sizes) // bucket)  # whole bucket batches covering every size checked
            x = _sample_inputs(tower, fixed, rows)
            expected = np.concatenate(
                [reference.run(None, {input_name: x[i : i + bucket]})[0] for i in range(0, rows, bucket)]
            )
            for n in sorted({*batch_sizes, bucket, rows}):
                got = candidate.run(None, {input_name: x[:n]})[0]
                if got.shape != expected[:n].shape or not _rows_agree(got, expected[:n], tolerance, min_cosine):
                    raise ValueError(f"batch {n} differs from the bucket graph")
        except (ValueError, *_ORT_ERRORS) as exc:
            failures.append(f"b{bucket}: {str(exc).splitlines()[0][:160]}")
            continue
        return relaxed, bucket
    raise ModelError(
        f"cannot make a batch-dynamic {tower} graph from the {precision} bucket graphs ({'; '.join(failures)}); "
        "export with --backend npu_ge, which uses a fixed-shape graph as it is"
    )
