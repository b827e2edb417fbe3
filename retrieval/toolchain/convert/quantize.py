"""Lower-precision variants of a simplified fp32 graph, and the shared output normalisation.

- fp16 (for NPU/GPU): every float tensor in float16, with float32 graph inputs and outputs so
  callers never change. Written here rather than with onnxconverter-common, whose converter
  mistypes the Cast that builds BERT's attention mask.
- int8 (for CPU): ONNX Runtime dynamic quantization, int8 weights per output channel, activations
  quantized on the fly. `quantize_activation_matmuls` also turns the attention matmuls (both
  operands activations; fp32 by default) into integer ops. Weights use 7 bits (`reduce_range`):
  on x86 CPUs without VNNI (AVX2, as on our machines) ORT's u8s8 kernels can saturate their 16-bit
  intermediate sums with full 8-bit weights. The output projection stays float32: its result *is*
  the embedding, so its rounding goes straight into the ranking, and it is the smallest matrix of
  the tower. On the demo model these two took int8's top-10 overlap with fp32 from 0.978 to 0.981.

Graphs are converted *before* the L2 normalisation is appended (`append_l2_normalize`), so the
normalisation always runs in float32 whatever the precision of the tower.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from retrieval.errors import ModelError

FP16_MAX = float(np.finfo(np.float16).max)


def _fp16_tensor(tensor: TensorProto) -> TensorProto:
    array = numpy_helper.to_array(tensor).astype(np.float32)
    return numpy_helper.from_array(np.clip(array, -FP16_MAX, FP16_MAX).astype(np.float16), tensor.name)


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float16 copy of `model` whose float32 inputs/outputs stay float32 (Casts at the edges)."""
    fp16 = onnx.ModelProto()
    fp16.CopyFrom(model)
    graph = fp16.graph
    for i, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.FLOAT:
            graph.initializer[i].CopyFrom(_fp16_tensor(tensor))
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT:
                attr.t.CopyFrom(_fp16_tensor(attr.t))
            elif node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.FLOAT16
    edge_nodes = []
    for value in graph.input:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            _rename_uses(graph, value.name, value.name + "_fp16")
            edge_nodes.append(helper.make_node("Cast", [value.name], [value.name + "_fp16"], to=TensorProto.FLOAT16))
    tail_nodes = []
    for value in graph.output:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            inner = value.name + "_fp16"
            for node in graph.node:
                for i, name in enumerate(node.output):
                    if name == value.name:
                        node.output[i] = inner
            _rename_uses(graph, value.name, inner)
            tail_nodes.append(helper.make_node("Cast", [inner], [value.name], to=TensorProto.FLOAT))
    nodes = [*edge_nodes, *graph.node, *tail_nodes]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]  # intermediate types changed; ONNX Runtime infers them again
    return fp16


class _DropPreprocessingHint(logging.Filter):
    """ORT's quantizer logs a 'run pre-processing' hint per call on the root logger; it does not apply here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def output_projections(model: onnx.ModelProto) -> list[str]:
    """Names of the MatMul nodes whose result is a graph output (a tower's projection to the embedding)."""
    outputs = {o.name for o in model.graph.output}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and any(o in outputs for o in n.output)]


def to_int8(
    model: onnx.ModelProto,
    per_channel: bool = True,
    quantize_activation_matmuls: bool = False,
    reduce_range: bool = True,
    keep_output_projection: bool = True,
) -> onnx.ModelProto:
    """Dynamic int8 quantization of MatMul/Conv/Gather weights (ONNX Runtime's quantizer)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="cnclip-int8-") as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save_model(model, str(src))
        hint_filter = _DropPreprocessingHint()
        logging.getLogger().addFilter(hint_filter)
        try:
            quantize_dynamic(
                src,
                dst,
                per_channel=per_channel,
                weight_type=QuantType.QInt8,
                reduce_range=reduce_range,
                nodes_to_exclude=output_projections(model) if keep_output_projection else [],
                extra_options={"MatMulConstBOnly": not quantize_activation_matmuls},
            )
        except (RuntimeError, ValueError) as exc:
            raise ModelError(f"int8 quantization failed: {exc}") from exc
        finally:
            logging.getLogger().removeFilter(hint_filter)
        return onnx.load(str(dst))


def append_l2_normalize(model: onnx.ModelProto, source: str, output: str) -> onnx.ModelProto:
    """Replace graph output `source` [b, d] (unnormalised, float32) with L2-normalised `output`."""
    graph = model.graph
    matches = [o for o in graph.output if o.name == source]
    if not matches:
        raise ModelError(f"graph has no output {source!r} (outputs: {', '.join(o.name for o in graph.output)})")
    value = matches[0]
    if value.type.tensor_type.elem_type != TensorProto.FLOAT:
        graph.node.append(helper.make_node("Cast", [source], [source + "_fp32"], to=TensorProto.FLOAT))
        source_fp32 = source + "_fp32"
    else:
        source_fp32 = source
    graph.node.append(helper.make_node("LpNormalization", [source_fp32], [output], axis=-1, p=2))
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]
    new_output = helper.make_tensor_value_info(output, TensorProto.FLOAT, dims or None)
    index = list(graph.output).index(value)
    graph.output.remove(value)
    graph.output.insert(index, new_output)
    return model
