"""One OpenVINO model for every bucket of a tower: the static bucket graphs made shape-dynamic.

Compiled per bucket, every OpenVINO session re-lays the weights out for its kernels — six text shapes
of ViT-B-16 int8 took 1,785 MB (issue 34), one copy per shape. The bucket graphs of a tower are the
same graph with other constants; retrieval/backends/bucket_shapes.py says which constants follow the
input's shape and how, and each is rebuilt here from the input's dimensions at run time. The result
takes a bounded dynamic batch (and length) — `[1..16, 1..52]` — compiled once. Anything else that
differs raises `NotBatchLinear` before the model is touched; the caller then compiles per bucket.

Calibrated int8 graphs (`int8-qdq`) differ once more: NNCF calibrates every bucket graph on its own.
Across batch sizes their weights are the same bytes but the activation ranges, zero points and
corrected biases differ (a ViT-B-16 text tower: 227 scalars between b1 and b8); across lengths
SmoothQuant rescaled the weights too (437 constants over its six shapes). No batch can pick one
calibration inside one compiled model — int8 kernels need constant ranges — so in a quantized graph
(one with FakeQuantize) a constant that
differs in value but not in shape is taken from the base graph (the smallest batch at the full
length): every shape runs the calibration the quality gate passed for that graph, and a text's vector
no longer depends on the bucket it was batched into (`Rewrite.recalibrated` counts them). Measured on
that tower (random weights, a shared 2-core AMX Xeon): cosine to fp32 within ±0.0003 of each shape's own
graph; a row alone and in a batch of 16 gave 1.000000 (0.99991 with per-bucket graphs).

The price of one model: a dynamic shape runs 2–10 % slower per call than a static compile of the
same shape there (b1 at 16 tokens 9.0 → 9.7 ms, b16 at 52 140.7 → 148.6 ms); `cnclip tune` measures
the sessions as served, so its choice of backend already pays it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from retrieval.backends.bucket_shapes import (
    Buckets,
    NotBatchLinear,
    Shape,
    ShapeVector,
    Sliced,
    describe,
    is_calibration,
)

__all__ = ["NotBatchLinear", "Rewrite", "dynamic_model"]


@dataclass(frozen=True)
class Rewrite:
    """The shape-dynamic model; which input axes it frees; how many calibration constants come from the base."""

    model: Any
    base_shape: Shape
    dynamic_axes: tuple[int, ...]
    recalibrated: int
    bounds: list[tuple[int, int]]  # each input axis's (least, most) over the buckets


def dynamic_model(models: Mapping[Shape, Any]) -> Rewrite:
    """The base of `models` (input shape → `ov.Model`, ≥ 2, one input each: the smallest batch at the
    largest other dimensions), rewritten in place to take every shape between theirs; raises
    `NotBatchLinear` (before it changes anything, so the models can still be compiled as they are)."""
    import openvino as ov
    import openvino.opset13 as ops

    if any(len(m.get_parameters()) != 1 for m in models.values()):
        raise NotBatchLinear("only single-input graphs of one rank are rewritten")
    buckets = Buckets.of(list(models))
    base_shape = buckets.base
    base = models[base_shape]
    base_ops = base.get_ordered_ops()
    others = {s: m.get_ordered_ops() for s, m in models.items() if s != base_shape}
    for shape, ops_ in others.items():
        if [op.get_type_name() for op in ops_] != [op.get_type_name() for op in base_ops]:
            raise NotBatchLinear(f"the {list(shape)} graph has other operations than the {list(base_shape)} one")
    for shape, model in models.items():
        if tuple(model.get_parameters()[0].get_partial_shape().to_shape()) != shape:
            raise NotBatchLinear(f"a graph's input is not the static shape {list(shape)} it was given as")

    param = base.get_parameters()[0]
    input_shape = ops.shape_of(param, "i64")
    dims = {a: ops.gather(input_shape, ops.constant(np.array([a], np.int64)), np.int64(0)) for a in buckets.axes}
    quantized = any(op.get_type_name() == "FakeQuantize" for op in base_ops)
    rebuilt: list[tuple[Any, Any]] = []  # (constant, what replaces it): applied only once all are known
    recalibrated = 0
    for index, op in enumerate(base_ops):
        if op.get_type_name() != "Constant":
            continue
        values = {base_shape: op.get_data(), **{s: ops_[index].get_data() for s, ops_ in others.items()}}
        if all(v.shape == values[base_shape].shape and np.array_equal(v, values[base_shape]) for v in values.values()):
            continue  # a weight, or a shape that does not involve the varying dimensions
        recipe = buckets.recipe(values)
        if recipe is not None:
            rebuilt.append((op, _emit(recipe, dims, ops)))
        elif quantized and is_calibration(values):
            recalibrated += 1  # stays as the base graph has it
        else:
            raise NotBatchLinear(f"constant {op.get_friendly_name()} {describe(values)} is not a function of the shape")
    for op, new in rebuilt:
        for target in list(op.output(0).get_target_inputs()):
            target.replace_source_output(new)
    # A varying axis takes every size from 1 to its largest bucket, as ONNX Runtime's one session
    # does: the encoder runs a batch between buckets unpadded, and a text at its longest row's width.
    bounds = buckets.bounds()
    free = [ov.Dimension(1, high) if low != high else ov.Dimension(low) for low, high in bounds]
    base.reshape({param.output(0): ov.PartialShape(free)})
    base.validate_nodes_and_infer_types()
    return Rewrite(base, base_shape, buckets.axes, recalibrated, bounds)


def _emit(recipe: ShapeVector | Sliced, dims: dict[int, Any], ops: Any) -> Any:
    """OpenVINO operations computing `recipe` from the input's dimensions `dims` (axis → [n] i64)."""
    if isinstance(recipe, ShapeVector):
        pieces = []
        for part in recipe.parts:
            if isinstance(part, tuple):
                pieces.append(ops.constant(np.array(part, recipe.dtype)))
                continue
            product = dims[part.factors[0]]
            for axis in part.factors[1:]:
                product = ops.multiply(product, dims[axis])
            if part.k != 1:
                product = ops.multiply(product, ops.constant(np.array([part.k], np.int64)))
            pieces.append(product if recipe.dtype == np.int64 else ops.convert(product, recipe.dtype))
        return ops.concat(pieces, 0).output(0)
    out = ops.constant(recipe.source)
    if recipe.cut:
        ends = ops.concat([dims[recipe.follows[i]] for i in recipe.cut], 0)
        zeros = ops.constant(np.zeros(len(recipe.cut), np.int64))
        ones = ops.constant(np.ones(len(recipe.cut), np.int64))
        out = ops.slice(out, zeros, ends, ones, ops.constant(np.array(recipe.cut, np.int64)))
    if recipe.broadcast:
        target = [
            dims[recipe.follows[i]] if i in recipe.follows else ops.constant(np.array([n], np.int64))
            for i, n in enumerate(recipe.shape)
        ]
        out = ops.broadcast(out, ops.concat(target, 0))
    return out.output(0)
