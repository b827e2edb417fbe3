"""`cnclip convert` on a tiny official-format checkpoint: graphs, manifest, report, parity gate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from cli.main import build_cli
from retrieval.errors import ModelError
from retrieval.manifest import ModelManifest
from retrieval.tokenizer import tokenize
from retrieval.toolchain.convert import pipeline
from retrieval.toolchain.convert.checkpoint import build_model, load_checkpoint
from retrieval.toolchain.convert.parity import PARITY_SENTENCES, run_in_buckets, sample_images
from retrieval.toolchain.convert.report import REPORT_NAME
from retrieval.toolchain.convert.simplify import gemm_to_matmul, simplify_graph
from tests.support.cnclip_models import TINY_VIT, reference_model

BUCKETS = (1, 4)
runner = CliRunner()


@pytest.fixture(scope="module")
def converted(tiny: dict[str, Path]) -> Path:
    out = tiny["root"] / "model"
    result = runner.invoke(
        build_cli(),
        ["convert", "--config", str(tiny["config"]), "--checkpoint", str(tiny["checkpoint"]), "--out", str(out)]
        + ["--buckets", ",".join(map(str, BUCKETS)), "--name", "tiny-test"],
    )
    assert result.exit_code == 0, result.output
    assert "Nodes by op type" in result.output and "Parity against PyTorch" in result.output
    return out


def test_manifest_lists_every_graph_and_the_logit_multiplier(converted: Path) -> None:
    manifest = ModelManifest.load(converted)  # verifies every sha256
    assert (manifest.name, manifest.arch, manifest.embed_dim) == ("tiny-test", "tiny-vit", 32)
    assert manifest.image_size == 64 and manifest.context_length == 52
    assert manifest.logit_scale == pytest.approx(1 / 0.07, rel=1e-3)  # exp() of the stored log scale
    for tower, (input_name, output_name) in {
        "image": ("image", "image_features"),
        "text": ("text", "text_features"),
    }.items():
        spec = manifest.towers[tower]
        assert (spec.input_name, spec.output_name) == (input_name, output_name)
        assert spec.precisions() == ["fp32", "fp16", "int8"]
        assert all(spec.buckets(p) == list(BUCKETS) for p in spec.precisions())


def test_graphs_have_static_shapes_and_feature_outputs_only(converted: Path) -> None:
    manifest = ModelManifest.load(converted)
    for tower, spec in manifest.towers.items():
        for precision in spec.precisions():
            for bucket in spec.buckets(precision):
                graph = onnx.load(str(manifest.graph_path(tower, precision, bucket)), load_external_data=False)
                assert max(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) >= 14
                (inp,) = graph.graph.input
                (out,) = graph.graph.output
                in_dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
                out_dims = [d.dim_value for d in out.type.tensor_type.shape.dim]
                if tower == "image":
                    assert inp.type.tensor_type.elem_type == TensorProto.FLOAT and in_dims == [bucket, 3, 64, 64]
                else:
                    assert inp.type.tensor_type.elem_type == TensorProto.INT64 and in_dims == [bucket, 52]
                assert out.name == spec.output_name and out_dims == [bucket, 32]
                assert out.type.tensor_type.elem_type == TensorProto.FLOAT
                assert not [n for n in graph.graph.node if n.op_type == "Mod"]


def test_buckets_share_one_weight_file_per_precision(converted: Path) -> None:
    report = json.loads((converted / REPORT_NAME).read_text())
    files = report["files"]
    params = sum(v.numel() for v in build_model(TINY_VIT).state_dict().values())
    # fp32 weights stored once for both buckets (not twice), int8 about a quarter of that.
    assert 0.8 * params * 4 < files["text.fp32.data"] + files["image.fp32.data"] < 1.05 * params * 4
    assert files["text.int8.data"] < 0.35 * files["text.fp32.data"]
    assert files["text.fp16.data"] < 0.55 * files["text.fp32.data"]
    assert all(files[f"image.fp32.b{b}.onnx"] < 100_000 for b in BUCKETS)
    assert {name: (converted / name).stat().st_size for name in files} == files


def test_report_counts_ops_before_and_after(converted: Path) -> None:
    report = json.loads((converted / REPORT_NAME).read_text())
    assert report["simplifier"] == "onnxsim" and report["opset"] == 17
    for tower in ("image", "text"):
        before, after = report["ops"][tower]["before"], report["ops"][tower]["after"]
        assert sum(after.values()) < sum(before.values()) / 2
        assert before.get("Constant", 0) > 20 and after.get("Constant", 0) < 10
        assert "Identity" in before and "Identity" not in after
        assert "Mod" not in after and "Shape" not in after
        assert report["final_ops"][tower]["int8"].get("DynamicQuantizeLinear", 0) > 0
    assert before["MatMul"] == after["MatMul"]  # folding never drops real compute
    parity = {(r["tower"], r["precision"]): r for r in report["parity"]}
    assert len(parity) == 6 and all(r["passed"] for r in parity.values())
    assert parity["text", "int8"]["threshold"] is None and 0.9 < parity["text", "int8"]["min_cosine"] <= 1.0
    assert 0.0 <= report["top10_overlap"]["int8"] <= 1.0 and report["top10_overlap"]["fp16"] >= 0.9


def test_int8_keeps_the_output_projection_in_float_and_uses_7_bit_weights(converted: Path) -> None:
    for tower, raw_output in (("image", "unnorm_image_features"), ("text", "unnorm_text_features")):
        graph = onnx.load(str(converted / f"{tower}.int8.b1.onnx")).graph
        producer = next(n for n in graph.node if raw_output in n.output)
        # The projection to the embedding is a float MatMul, fed straight by a float weight.
        assert producer.op_type == "MatMul"
        weights = {t.name: t for t in graph.initializer}
        assert weights[producer.input[1]].data_type == TensorProto.FLOAT
        # Every other weight matrix is int8, within 7 bits (reduce_range: no u8s8 saturation on AVX2).
        quantized = [numpy_helper.to_array(t) for t in graph.initializer if t.data_type == TensorProto.INT8]
        assert quantized and all(np.abs(w.astype(np.int16)).max() <= 64 for w in quantized)


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(("precision", "threshold"), [("fp32", 0.99999), ("fp16", 0.999)])
def test_graphs_match_cnclip_reference_model(
    converted: Path, tiny: dict[str, Path], precision: str, threshold: float
) -> None:
    """Independent of the converter's own gate: cn_clip's model.py vs the saved graphs."""
    ref = reference_model(TINY_VIT, seed=3)
    _, state = load_checkpoint(tiny["checkpoint"])
    ref.load_state_dict(state, strict=False)  # the same fp16-rounded weights the converter saw
    manifest = ModelManifest.load(converted)
    texts = tokenize(list(PARITY_SENTENCES[:4]))
    images = sample_images(4, 64, seed=5)
    with torch.no_grad():
        want_text = F.normalize(ref.encode_text(torch.from_numpy(texts)), dim=-1).numpy()
        want_image = F.normalize(ref.encode_image(torch.from_numpy(images)), dim=-1).numpy()
    got_text = _session(manifest.graph_path("text", precision, 4)).run(None, {"text": texts})[0]
    got_image = _session(manifest.graph_path("image", precision, 4)).run(None, {"image": images})[0]
    np.testing.assert_allclose(np.linalg.norm(got_text, axis=1), 1.0, atol=1e-5)
    assert (got_text * want_text).sum(1).min() >= threshold
    assert (got_image * want_image).sum(1).min() >= threshold


def test_parity_gate_failure_is_clear_and_leaves_no_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from retrieval.toolchain.convert import quantize

    def broken_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
        converted = quantize.to_fp16(model)
        for tensor in converted.graph.initializer:  # a converter bug: weights scrambled
            if tensor.data_type == TensorProto.FLOAT16 and len(tensor.dims) == 2:
                array = numpy_helper.to_array(tensor)
                tensor.CopyFrom(numpy_helper.from_array(array[::-1].copy(), tensor.name))
        return converted

    monkeypatch.setattr(pipeline, "to_fp16", broken_fp16)
    torch.manual_seed(0)
    with pytest.raises(ModelError, match=r"parity gate failed(.|\n)*text fp16: min cosine") as info:
        pipeline.convert_model(build_model(TINY_VIT), tmp_path, "tiny", buckets=[1], precisions=["fp32", "fp16"])
    assert "image fp32" not in info.value.message
    assert not (tmp_path / "manifest.json").exists() and (tmp_path / REPORT_NAME).exists()


def test_unfoldable_mod_is_refused() -> None:
    graph = helper.make_graph(
        [helper.make_node("Mod", ["x", "three"], ["y"])],
        "mod",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [4])],
        initializer=[numpy_helper.from_array(np.array(3, dtype=np.int64), "three")],
    )
    with pytest.raises(ModelError, match="Mod"):
        simplify_graph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_gemm_becomes_matmul_add_with_the_same_result() -> None:
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)],
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, 3)).astype(np.float32)
    rewritten = gemm_to_matmul(model)
    assert [n.op_type for n in rewritten.graph.node] == ["MatMul", "Add"]
    got = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got[0], x @ w.T + b, rtol=1e-5)


def test_cli_errors_are_one_line_messages(tiny: dict[str, Path], tmp_path: Path) -> None:
    cli = build_cli()
    cases = [
        (["--arch", "ViT-B-16", "--checkpoint", str(tmp_path / "nope.pt")], "checkpoint not found"),
        (["--arch", "ViT-B-16", "--config", str(tiny["config"]), "--random-init"], "--arch or --config, not both"),
        (["--arch", "ViT-B-16"], "exactly one of --checkpoint"),
        (["--arch", "ViT-X", "--random-init"], "unknown architecture 'ViT-X'"),
        (["--arch", "RN50", "--checkpoint", str(tiny["checkpoint"])], "does not match the architecture"),
        (["--config", str(tiny["config"]), "--random-init", "--buckets", "0,4"], "--buckets must be positive"),
    ]
    for args, message in cases:
        result = runner.invoke(cli, ["convert", "--out", str(tmp_path / "o"), *args])
        assert result.exit_code == 1, (args, result.output)
        assert "error:" in result.output and message in result.output, (args, result.output)
        assert "Traceback" not in result.output


def test_parity_sentences_are_real_chinese() -> None:
    assert len(PARITY_SENTENCES) >= 20 and len(set(PARITY_SENTENCES)) == len(PARITY_SENTENCES)
    ids = tokenize(list(PARITY_SENTENCES))
    lengths = (ids != 0).sum(1)
    assert lengths.min() >= 8 and math.isclose(float((ids == 100).sum()), 0.0)  # no [UNK]


def test_text_length_graphs_give_the_full_graphs_vectors(converted: Path) -> None:
    """Every text that fits a length bucket gets the 52-token graph's vector (fp32 cosine ≥ 0.99999),
    at every batch bucket; the graphs take [b, L] and the ids are the tokenizer's, cut after padding."""
    manifest = ModelManifest.load(converted)
    assert manifest.text_lengths("fp32") == [16, 32, 52]  # `cnclip convert`'s default --text-lengths
    texts = ["猫", "a", *PARITY_SENTENCES, "一张清晰的" + PARITY_SENTENCES[0] + "的照片", "长" * 60]
    ids = tokenize(texts)
    used = (ids != 0).sum(axis=1)

    def vectors(path: Path, rows: np.ndarray, bucket: int) -> np.ndarray:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return run_in_buckets(lambda chunk: session.run(None, {"text": chunk})[0], rows, bucket)

    full = vectors(manifest.graph_path("text", "fp32", 1), ids, 1)
    for length in (16, 32):
        fits = used <= length
        assert 0 < fits.sum() < len(texts)  # some texts fit, some do not
        for bucket in BUCKETS:
            path = manifest.graph_path("text", "fp32", bucket, length)
            graph = onnx.load(str(path), load_external_data=False)
            assert [d.dim_value for d in graph.graph.input[0].type.tensor_type.shape.dim] == [bucket, length]
            got = vectors(path, ids[fits, :length], bucket)
            assert ((got * full[fits]).sum(axis=1) >= 0.99999).all(), (length, bucket)
    report = json.loads((converted / REPORT_NAME).read_text())
    assert {(r["tower"], r["precision"], r["length"]) for r in report["parity"] if r["tower"] == "text"} >= {
        ("text", "fp32", 16),
        ("text", "fp32", 32),
        ("text", "fp32", None),
    }
