"""One OpenVINO model for every bucket of a tower: the static bucket graphs made shape-dynamic.

`cnclip convert` exports every bucket at its own batch size (and text length) and folds all shape
arithmetic into constants (retrieval/toolchain/convert/export.py), so a bucket graph cannot simply
be reshaped: its Reshape targets say `[8, 52, 12, 64]`, the class token is stored already broadcast
to `[8, 1, 768]` and the position embeddings already cut to 52 rows. Compiled per bucket, every
OpenVINO session re-lays the weights out for its kernels — six text shapes of ViT-B-16 int8 took
1,785 MB (issue 34), one copy per shape.

The bucket graphs of a tower are the same graph with other constants. Comparing them op by op says
which constants follow the input's shape; each is rebuilt from the input's dimensions at run time,
and the result takes a bounded dynamic batch (and length) — `[1..16, 16..52]` — compiled once. Only
these forms are rewritten, and only where every graph agrees with them exactly (anything else raises
`NotBatchLinear` before the model is touched; the caller then compiles per bucket, as before):

- an integer shape vector whose entries are constants or `k × batch`, `k × length`, `k × batch × length`
  (Reshape targets);
- a tensor with an axis as long as an input dimension, whose slices along it are all the same
  (stored broadcast to the batch: one slice, broadcast at run time) or each graph's a prefix of the
  longest's (position embeddings: cut at run time).

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

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Shape = tuple[int, ...]


class NotBatchLinear(ValueError):
    """The bucket graphs differ in a way that is not a function of the input's shape alone."""


@dataclass(frozen=True)
class Rewrite:
    """The shape-dynamic model; which input axes it frees; how many calibration constants come from the base."""

    model: Any
    base_shape: Shape
    dynamic_axes: tuple[int, ...]
    recalibrated: int


def dynamic_model(models: Mapping[Shape, Any]) -> Rewrite:
    """The base of `models` (input shape → `ov.Model`, ≥ 2, one input each: the smallest batch at the
    largest other dimensions), rewritten in place to take every shape between theirs; raises
    `NotBatchLinear` (before it changes anything, so the models can still be compiled as they are)."""
    import openvino as ov
    import openvino.opset13 as ops

    if len(models) < 2:
        raise NotBatchLinear("one bucket graph says nothing about how the others differ")
    ranks = {len(shape) for shape in models}
    if len(ranks) != 1 or any(len(m.get_parameters()) != 1 for m in models.values()):
        raise NotBatchLinear("only single-input graphs of one rank are rewritten")
    shapes = list(models)
    axes = tuple(a for a in range(len(shapes[0])) if len({s[a] for s in shapes}) > 1)
    base_shape = min(shapes, key=lambda s: (tuple(-s[a] for a in axes if a), s[0]))
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
    dims = {a: ops.gather(input_shape, ops.constant(np.array([a], np.int64)), np.int64(0)) for a in axes}
    context = _Context(shapes, base_shape, axes, dims, ops)
    quantized = any(op.get_type_name() == "FakeQuantize" for op in base_ops)
    rebuilt: list[tuple[Any, Any]] = []  # (constant, what replaces it): applied only once all are known
    recalibrated = 0
    for index, op in enumerate(base_ops):
        if op.get_type_name() != "Constant":
            continue
        values = {base_shape: op.get_data(), **{s: ops_[index].get_data() for s, ops_ in others.items()}}
        if all(v.shape == values[base_shape].shape and np.array_equal(v, values[base_shape]) for v in values.values()):
            continue  # a weight, or a shape that does not involve the varying dimensions
        new = context.shape_vector(values) or context.sliced_or_broadcast(values)
        if new is not None:
            rebuilt.append((op, new))
        elif quantized and _calibration(values):
            recalibrated += 1  # stays as the base graph has it
        else:
            raise NotBatchLinear(f"constant {op.get_friendly_name()} {_shapes(values)} is not a function of the shape")
    for op, new in rebuilt:
        for target in list(op.output(0).get_target_inputs()):
            target.replace_source_output(new)
    bounds = [
        ov.Dimension(min(s[a] for s in shapes), max(s[a] for s in shapes)) if a in axes else ov.Dimension(n)
        for a, n in enumerate(base_shape)
    ]
    base.reshape({param.output(0): ov.PartialShape(bounds)})
    base.validate_nodes_and_infer_types()
    return Rewrite(base, base_shape, axes, recalibrated)


def _calibration(values: Mapping[Shape, np.ndarray]) -> bool:
    """What per-bucket calibration changes: float or 8-bit values of one shape in every graph (never a shape)."""
    first = next(iter(values.values()))
    same_shape = all(v.shape == first.shape for v in values.values())
    return same_shape and (first.dtype.kind == "f" or first.dtype in (np.int8, np.uint8))


def _shapes(values: Mapping[Shape, np.ndarray]) -> str:
    return ", ".join(f"{list(s)}: {list(v.shape)}" for s, v in values.items())


class _Context:
    """The graphs' input shapes and the run-time dimensions that rebuilt constants are made from."""

    def __init__(self, shapes: Sequence[Shape], base: Shape, axes: tuple[int, ...], dims: dict[int, Any], ops: Any):
        self.shapes, self.base, self.axes, self.dims, self.ops = shapes, base, axes, dims, ops
        # Products of the varying dimensions an entry may be a multiple of, fewest factors first.
        self.products = [c for n in range(1, len(axes) + 1) for c in itertools.combinations(axes, n)]

    def shape_vector(self, values: Mapping[Shape, np.ndarray]) -> Any:
        """Entries that are equal everywhere stay; the others must be `k × Π dims` in every graph."""
        first = values[self.base]
        if first.ndim != 1 or first.dtype.kind not in "iu" or any(v.shape != first.shape for v in values.values()):
            return None
        ops, pieces, constants = self.ops, [], []
        for j in range(first.shape[0]):
            entries = {s: int(v[j]) for s, v in values.items()}
            if len(set(entries.values())) == 1:
                constants.append(entries[self.base])
                continue
            term = self._term(entries)
            if term is None:
                return None
            if constants:
                pieces.append(ops.constant(np.array(constants, first.dtype)))
                constants = []
            k, factors = term
            product = self.dims[factors[0]]
            for axis in factors[1:]:
                product = ops.multiply(product, self.dims[axis])
            if k != 1:
                product = ops.multiply(product, ops.constant(np.array([k], np.int64)))
            pieces.append(product if first.dtype == np.int64 else ops.convert(product, first.dtype))
        if constants:
            pieces.append(ops.constant(np.array(constants, first.dtype)))
        return ops.concat(pieces, 0).output(0)

    def _term(self, entries: Mapping[Shape, int]) -> tuple[int, tuple[int, ...]] | None:
        for factors in self.products:
            per = {s: int(np.prod([s[a] for a in factors])) for s in entries}
            ks = {e // per[s] for s, e in entries.items() if e % per[s] == 0}
            if len(ks) == 1 and all(e % per[s] == 0 for s, e in entries.items()):
                return ks.pop(), factors
        return None

    def sliced_or_broadcast(self, values: Mapping[Shape, np.ndarray]) -> Any:
        """Axes as long as an input dimension: slices all equal (broadcast them) or prefixes of the base's (cut)."""
        base = values[self.base]
        if base.ndim == 0 or any(v.ndim != base.ndim for v in values.values()):
            return None
        follows: dict[int, int] = {}  # constant axis -> input axis it is as long as
        for i in range(base.ndim):
            sizes = {s: v.shape[i] for s, v in values.items()}
            if len(set(sizes.values())) == 1:
                continue
            matching = [a for a in self.axes if all(sizes[s] == s[a] for s in sizes)]
            if not matching:
                return None
            follows[i] = matching[0]
        if not follows:
            return None
        source = base
        broadcast = {i for i in follows if np.array_equal(base, np.broadcast_to(base.take([0], axis=i), base.shape))}
        for i in broadcast:
            source = source.take([0], axis=i)
        for shape, value in values.items():  # the recipe must give every graph exactly its constant
            expected = source
            for i, a in follows.items():
                if i not in broadcast:
                    if shape[a] > expected.shape[i]:
                        return None  # longer than the base's: nothing to cut it from
                    expected = expected.take(range(shape[a]), axis=i)
            target = [shape[follows[i]] if i in follows else n for i, n in enumerate(base.shape)]
            if not np.array_equal(np.broadcast_to(expected, target), value):
                return None
        ops = self.ops
        out = ops.constant(np.ascontiguousarray(source))
        cut = sorted(set(follows) - broadcast)
        if cut:
            ends = ops.concat([self.dims[follows[i]] for i in cut], 0)
            zeros = ops.constant(np.zeros(len(cut), np.int64))
            ones = ops.constant(np.ones(len(cut), np.int64))
            out = ops.slice(out, zeros, ends, ones, ops.constant(np.array(cut, np.int64)))
        if broadcast:
            target = [
                self.dims[follows[i]] if i in follows else ops.constant(np.array([n], np.int64))
                for i, n in enumerate(base.shape)
            ]
            out = ops.broadcast(out, ops.concat(target, 0))
        return out.output(0)
