"""One ONNX Runtime graph for every bucket of a tower on the CPU: the static bucket graphs made shape-dynamic.

Why (issue 34): the bucket sessions of a tower read one shared, mapped copy of its weights
(retrieval/shared_weights.py), and ONNX Runtime does not prepack weights a session did not load
itself, so every batched shape ran on unpacked weights — slower per row than batch 1, and the batcher
then had no reason to batch: throughput fell as concurrency rose. A session per bucket with its own
prepacked copy costs one copy per shape. One session whose graph takes every batch size and text
length between the buckets' holds one prepacked copy and runs any batch unpadded.

The bucket graphs are the same graph with other constants (retrieval/backends/bucket_shapes.py says
which follow the input's shape and how); each such constant of the base graph is replaced by the few
operations that compute it from `Shape(input)`, under the same tensor name, so nothing that reads it
changes. Stored weights stay where they are: the graph keeps its external-data references and the
session reads them from the model folder. Only the dynamically quantized `int8` and float graphs
are rewritten; anything else that differs between the graphs raises `NotBatchLinear` (the caller
then opens a session per bucket, as before).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from retrieval.backends.bucket_shapes import Buckets, NotBatchLinear, Shape, ShapeVector, Sliced, describe

__all__ = ["DynamicGraph", "NotBatchLinear", "dynamic_graph", "input_shape"]

AXIS_NAMES = ("batch", "length")


@dataclass(frozen=True)
class DynamicGraph:
    """The rewritten base graph (external data still in `folder`); the input shapes it takes."""

    model: onnx.ModelProto
    folder: Path
    base_shape: Shape
    bounds: list[tuple[int, int]]  # each input axis's (least, most)
    rebuilt: int  # constants now computed from the input's shape


def dynamic_graph(paths: Mapping[Shape, Path]) -> DynamicGraph:
    """The graphs at `paths` (input shape → file, ≥ 2, one folder) as one graph taking every shape
    between theirs; `NotBatchLinear` when they differ in anything but shape-following constants."""
    buckets = Buckets.of(list(paths))
    folders = {p.parent for p in paths.values()}
    if len(folders) != 1:
        raise NotBatchLinear("the bucket graphs are in different folders")
    folder = folders.pop()
    models = {s: onnx.load(str(p), load_external_data=False) for s, p in paths.items()}
    for shape, model in models.items():
        _check_alike(model, models[buckets.base], shape, buckets.base)
    base = models[buckets.base]
    graph = base.graph
    data = _StoredData(folder)
    replaced: dict[str, ShapeVector | Sliced] = {}  # tensor name -> its recipe
    for index, tensor in enumerate(graph.initializer):
        if not _differs(models, index):
            continue
        recipe = _recipe(buckets, {s: data.array(m.graph.initializer[index]) for s, m in models.items()}, tensor.name)
        if recipe is not None:
            replaced[tensor.name] = recipe
    constant_nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        if node.op_type != "Constant":
            continue
        recipe = _recipe(buckets, {s: _constant_value(m.graph.node[index]) for s, m in models.items()}, node.name)
        if recipe is not None:
            replaced[node.output[0]] = recipe
            constant_nodes.append(node)

    emitter = _Emitter(graph.input[0].name, buckets.axes)
    new_nodes = [n for name, recipe in replaced.items() for n in emitter.emit(recipe, name)]
    kept_initializers = [t for t in graph.initializer if t.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(kept_initializers + emitter.constants)
    kept_nodes = [n for n in graph.node if not any(n is c for c in constant_nodes)]
    del graph.node[:]
    graph.node.extend(emitter.nodes_before + new_nodes + kept_nodes)
    _free_axes(graph.input[0], buckets.axes)
    for index, output in enumerate(graph.output):
        varying = [
            a
            for a, dim in enumerate(output.type.tensor_type.shape.dim)
            if len({m.graph.output[index].type.tensor_type.shape.dim[a].dim_value for m in models.values()}) > 1
        ]
        _free_axes(output, tuple(varying))
    del graph.value_info[:]  # the static shapes inferred for the base graph no longer hold
    return DynamicGraph(base, folder, buckets.base, buckets.bounds(), len(replaced))


def input_shape(path: Path) -> Shape:
    """The static input shape of the graph at `path` (-1 for a dimension without a fixed size)."""
    model = onnx.load(str(path), load_external_data=False)
    return _input_dims(model.graph)


def _input_dims(graph: onnx.GraphProto) -> Shape:
    inputs = [i for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    if len(inputs) != 1:
        raise NotBatchLinear("only single-input graphs are rewritten")
    return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in inputs[0].type.tensor_type.shape.dim)


def _check_alike(model: onnx.ModelProto, base: onnx.ModelProto, shape: Shape, base_shape: Shape) -> None:
    graph = model.graph
    if _input_dims(graph) != shape:
        raise NotBatchLinear(f"a graph's input is not the static shape {list(shape)} it was given as")
    if [n.op_type for n in graph.node] != [n.op_type for n in base.graph.node]:
        raise NotBatchLinear(f"the {list(shape)} graph has other operations than the {list(base_shape)} one")
    if len(graph.initializer) != len(base.graph.initializer) or len(graph.output) != len(base.graph.output):
        raise NotBatchLinear(
            f"the {list(shape)} graph has other initializers or outputs than the {list(base_shape)} one"
        )
    for node, base_node in zip(graph.node, base.graph.node, strict=True):
        if node.op_type != "Constant" and _attributes(node) != _attributes(base_node):
            raise NotBatchLinear(f"{node.op_type} {node.name} has other attributes in the {list(shape)} graph")


def _attributes(node: onnx.NodeProto) -> list[tuple[str, Any]]:
    return [(a.name, helper.get_attribute_value(a)) for a in node.attribute]


def _differs(models: Mapping[Shape, onnx.ModelProto], index: int) -> bool:
    tensors = [m.graph.initializer[index] for m in models.values()]
    first = tensors[0]
    if all(t.data_location == TensorProto.EXTERNAL for t in tensors):
        return any(_where(t) != _where(first) or list(t.dims) != list(first.dims) for t in tensors)
    return True  # inline tensors are compared by value (small: shapes and scalars)


def _where(tensor: TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def _recipe(buckets: Buckets, values: Mapping[Shape, np.ndarray], name: str) -> ShapeVector | Sliced | None:
    first = values[buckets.base]
    if all(v.shape == first.shape and np.array_equal(v, first) for v in values.values()):
        return None
    recipe = buckets.recipe(values)
    if recipe is None:
        raise NotBatchLinear(f"constant {name} {describe(values)} is not a function of the shape")
    return recipe


def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    for attribute in node.attribute:
        if attribute.name == "value":
            return numpy_helper.to_array(attribute.t)
        return np.asarray(helper.get_attribute_value(attribute))
    raise NotBatchLinear(f"Constant {node.name} has no value")


class _StoredData:
    """Reads initializers, external ones from the model folder's data files (never outside it)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder.resolve()

    def array(self, tensor: TensorProto) -> np.ndarray:
        if tensor.data_location != TensorProto.EXTERNAL:
            return numpy_helper.to_array(tensor)
        where = _where(tensor)
        path = (self.folder / where["location"]).resolve()
        if path.parent != self.folder:
            raise NotBatchLinear(f"{tensor.name}'s data is outside the model folder")
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        offset, length = int(where.get("offset", 0)), int(where["length"])
        raw = np.fromfile(path, dtype=np.uint8, count=length, offset=offset)
        return raw.view(dtype).reshape(tuple(tensor.dims))


class _Emitter:
    """ONNX nodes computing recipes from the graph input's dimensions."""

    def __init__(self, input_name: str, axes: tuple[int, ...]) -> None:
        self.constants: list[TensorProto] = []
        self.nodes_before: list[onnx.NodeProto] = []
        self._count = 0
        shape = self._name("shape")
        self.nodes_before.append(helper.make_node("Shape", [input_name], [shape]))
        self.dims: dict[int, str] = {}
        for axis in axes:
            index = self._constant(np.array([axis], np.int64))
            self.dims[axis] = self._name(f"dim{axis}")
            self.nodes_before.append(helper.make_node("Gather", [shape, index], [self.dims[axis]], axis=0))

    def _name(self, what: str) -> str:
        self._count += 1
        return f"cnclip_dynamic/{what}_{self._count}"

    def _constant(self, value: np.ndarray) -> str:
        name = self._name("const")
        self.constants.append(numpy_helper.from_array(value, name))
        return name

    def emit(self, recipe: ShapeVector | Sliced, output: str) -> list[onnx.NodeProto]:
        if isinstance(recipe, ShapeVector):
            return self._shape_vector(recipe, output)
        return self._sliced(recipe, output)

    def _shape_vector(self, recipe: ShapeVector, output: str) -> list[onnx.NodeProto]:
        nodes: list[onnx.NodeProto] = []
        pieces: list[str] = []
        for part in recipe.parts:
            if isinstance(part, tuple):
                pieces.append(self._constant(np.array(part, np.int64)))
                continue
            product = self.dims[part.factors[0]]
            for axis in part.factors[1:]:
                product = self._op(nodes, "Mul", product, self.dims[axis])
            if part.k != 1:
                product = self._op(nodes, "Mul", product, self._constant(np.array([part.k], np.int64)))
            pieces.append(product)
        if recipe.dtype == np.int64:
            nodes.append(helper.make_node("Concat", pieces, [output], axis=0))
        else:
            joined = self._op(nodes, "Concat", *pieces, axis=0)
            to = helper.np_dtype_to_tensor_dtype(recipe.dtype)
            nodes.append(helper.make_node("Cast", [joined], [output], to=to))
        return nodes

    def _sliced(self, recipe: Sliced, output: str) -> list[onnx.NodeProto]:
        nodes: list[onnx.NodeProto] = []
        out = self._constant(recipe.source)
        if recipe.cut:
            ends = self._op(nodes, "Concat", *[self.dims[recipe.follows[i]] for i in recipe.cut], axis=0)
            zeros = self._constant(np.zeros(len(recipe.cut), np.int64))
            axes = self._constant(np.array(recipe.cut, np.int64))
            out = self._op(nodes, "Slice", out, zeros, ends, axes)
        if recipe.broadcast:
            target = [
                self.dims[recipe.follows[i]] if i in recipe.follows else self._constant(np.array([n], np.int64))
                for i, n in enumerate(recipe.shape)
            ]
            shape = self._op(nodes, "Concat", *target, axis=0)
            out = self._op(nodes, "Expand", out, shape)
        nodes.append(helper.make_node("Identity", [out], [output]))
        return nodes

    def _op(self, nodes: list[onnx.NodeProto], op: str, *inputs: str, **attributes: Any) -> str:
        name = self._name(op.lower())
        nodes.append(helper.make_node(op, list(inputs), [name], **attributes))
        return name


def _free_axes(value: onnx.ValueInfoProto, axes: tuple[int, ...]) -> None:
    dims = value.type.tensor_type.shape.dim
    for axis in axes:
        dims[axis].Clear()
        dims[axis].dim_param = AXIS_NAMES[axis] if axis < len(AXIS_NAMES) else f"axis{axis}"
