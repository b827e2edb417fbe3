"""benchmarks/peak.py: multiply-accumulates counted from a graph, and the "% of peak" arithmetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from benchmarks.peak import (
    Peak,
    Rate,
    graph_macs,
    graph_macs_by_op,
    matmul_graph,
    merge_rounds,
    peak_for,
    percent_of_peak,
)
from retrieval.toolchain.convert.quantize import to_int8


def weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ones(shape, dtype=np.float32), name)


def tiny_graph() -> onnx.ModelProto:
    """Conv (strided, grouped) → flatten → Gemm (transB) → batched attention-like MatMul → Relu.

    MACs by hand:
    - Conv: x [2, 4, 8, 8], W [6, 2, 3, 3], group 2, stride 2, pad 1 → y [2, 6, 4, 4];
      each output sums 2 · 3 · 3 = 18 products: 2·6·4·4 · 18 = 3456.
    - Gemm: [2, 96] · W[10, 96]ᵀ → [2, 10]: 2 · 96 · 10 = 1920.
    - MatMul: [3, 5, 7] · [7, 4] (broadcast over 3) → [3, 5, 4]: 3 · 5 · 7 · 4 = 420.
    - MatMul: [3, 5, 4] · [3, 4, 5] → [3, 5, 5]: 3 · 5 · 4 · 5 = 300 (both operands activations).
    """
    nodes = [
        helper.make_node("Conv", ["x", "cw"], ["c"], group=2, strides=[2, 2], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Flatten", ["c"], ["f"]),
        helper.make_node("Gemm", ["f", "gw"], ["g"], transB=1),
        helper.make_node("MatMul", ["q", "mw"], ["m"]),
        helper.make_node("MatMul", ["m", "k"], ["s"]),
        helper.make_node("Relu", ["s"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8, 8]),
            helper.make_tensor_value_info("q", TensorProto.FLOAT, [3, 5, 7]),
            helper.make_tensor_value_info("k", TensorProto.FLOAT, [3, 4, 5]),
        ],
        [
            helper.make_tensor_value_info("g", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("out", TensorProto.FLOAT, None),
        ],
        [weight("cw", 6, 2, 3, 3), weight("gw", 10, 96), weight("mw", 7, 4)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_macs_of_a_tiny_graph_match_the_hand_count() -> None:
    assert graph_macs_by_op(tiny_graph()) == {"Conv": 3456, "Gemm": 1920, "MatMul": 420 + 300}
    assert graph_macs(tiny_graph()) == 3456 + 1920 + 720


def test_a_saved_graph_is_counted_without_reading_its_external_data(tmp_path: Path) -> None:
    model = matmul_graph(16, 32, 64)
    path = tmp_path / "gemm.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="gemm.data", size_threshold=0)
    (tmp_path / "gemm.data").unlink()  # shapes live in the .onnx file; the weights are not needed
    assert graph_macs(path) == 16 * 32 * 64


def test_int8_graph_does_the_same_arithmetic_as_its_fp32_source() -> None:
    """to_int8 turns MatMul into DynamicQuantizeLinear + MatMulInteger: the count follows the new op."""
    fp32 = matmul_graph(8, 32, 16)
    int8 = to_int8(fp32, keep_output_projection=False)
    assert graph_macs_by_op(fp32) == {"MatMul": 8 * 32 * 16}
    assert graph_macs_by_op(int8) == {"MatMulInteger": 8 * 32 * 16}


def test_a_matmul_without_static_shapes_is_an_error_not_a_zero() -> None:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        "dynamic",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(ValueError, match="no static shape for 'a'"):
        graph_macs(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_percent_of_peak() -> None:
    # 10 GMAC in 0.5 s = 40 GOP/s; against an 80 GOP/s peak that is half.
    assert percent_of_peak(10 * 10**9, 0.5, 80.0) == pytest.approx(50.0)


def test_rounds_merge_to_each_source_median_and_the_best_source() -> None:
    def round_of(int8_a: float, int8_b: float) -> list[Peak]:
        rates = [Rate("a", 2, int8_a), Rate("b", 2, int8_b)]
        return [Peak("int8", 2, max(int8_a, int8_b), "", rates)]

    merged = merge_rounds([round_of(100, 90), round_of(10, 95), round_of(120, 80)])
    peak = peak_for(merged, "int8", 2)
    assert peak is not None
    # a: median 100 over [100, 10, 120]; b: median 90 over [90, 95, 80] → a is the peak, one bad round ignored.
    assert (peak.source, peak.gops) == ("a", 100.0)
    assert sorted(r.runs for r in peak.rates) == [[90.0, 95.0, 80.0], [100.0, 10.0, 120.0]]
    assert peak_for(merged, "fp32", 2) is None
