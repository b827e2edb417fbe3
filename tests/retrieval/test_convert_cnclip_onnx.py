"""`cnclip convert --from-cnclip-onnx`: graphs made the way Chinese-CLIP's own exporter makes them.

The fixture follows `cn_clip/deploy/pytorch_to_onnx.py`: cn_clip's CLIP exported with
`torch.onnx.export(model, (None, text))` / `(image, None)`, batch 1, outputs `unnorm_*_features`,
the vision graph without constant folding; fp16 variants with float32 inputs/outputs saved with a
`.extra_file` of external data. Two deviations, both forced by this environment: the vision graph
uses opset 14 (torch 2.13's nn.MultiheadAttention lowers to scaled_dot_product_attention, which
opset 13 cannot express), and the fp16 cast is the project's own `to_fp16` (onnxmltools is not
installed); its result has the same interface as onnxmltools' `keep_io_types=True` output.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from cli.main import build_cli
from retrieval.manifest import ModelManifest
from retrieval.tokenizer import tokenize
from retrieval.toolchain.convert.parity import PARITY_SENTENCES, sample_images
from retrieval.toolchain.convert.quantize import to_fp16
from retrieval.toolchain.convert.report import REPORT_NAME
from tests.support.cnclip_models import TINY_VIT, reference_model

runner = CliRunner()


def _save_like_cnclip(model: onnx.ModelProto, path: Path) -> None:
    onnx.save_model(
        model,
        str(path),
        location=f"{path.name}.extra_file",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        size_threshold=1024,
        convert_attribute=True,
    )


def export_like_cnclip(prefix: Path, dynamic_text_batch: bool = False) -> torch.nn.Module:
    model = reference_model(TINY_VIT, seed=7)
    text = torch.from_numpy(tokenize([""]))
    image = torch.zeros(1, 3, 64, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (None, text),
            f"{prefix}.txt.fp32.onnx",
            input_names=["text"],
            output_names=["unnorm_text_features"],
            export_params=True,
            opset_version=13,
            dynamo=False,
            dynamic_axes={"text": {0: "batch"}} if dynamic_text_batch else None,
        )
        torch.onnx.export(
            model,
            (image, None),
            f"{prefix}.img.fp32.onnx",
            input_names=["image"],
            output_names=["unnorm_image_features"],
            export_params=True,
            do_constant_folding=False,
            opset_version=14,
            dynamo=False,
        )
    for tower in ("txt", "img"):
        fp32 = onnx.load(f"{prefix}.{tower}.fp32.onnx")
        _save_like_cnclip(to_fp16(fp32), Path(f"{prefix}.{tower}.fp16.onnx"))
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    root = tmp_path_factory.mktemp("cnclip-onnx")
    model = export_like_cnclip(root / "tiny")
    return root / "tiny", model


def test_fixture_is_shaped_like_the_official_exporter_output(exported: tuple[Path, torch.nn.Module]) -> None:
    prefix, _ = exported
    assert Path(f"{prefix}.img.fp16.onnx.extra_file").is_file() and Path(f"{prefix}.txt.fp16.onnx.extra_file").is_file()
    graph = onnx.load(f"{prefix}.img.fp32.onnx", load_external_data=False)
    assert [o.name for o in graph.graph.output] == ["unnorm_image_features"]
    assert any(n.op_type == "Mod" for n in graph.graph.node)  # the seed article's constant Mod


def test_wrap_renames_normalises_and_folds_mod(exported: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    prefix, ref = exported
    out = tmp_path / "wrapped"
    result = runner.invoke(
        build_cli(), ["convert", "--from-cnclip-onnx", str(prefix), "--out", str(out), "--buckets", "1,4"]
    )
    assert result.exit_code == 0, result.output
    assert "bucket 1 only" in result.output  # said clearly: the exporter baked batch 1 in
    manifest = ModelManifest.load(out)
    assert manifest.embed_dim == 32 and manifest.image_size == 64 and manifest.logit_scale == 100.0
    for tower in ("image", "text"):
        assert manifest.towers[tower].precisions() == ["fp32", "fp16"]
        assert manifest.towers[tower].buckets("fp32") == [1]
    import json

    report = json.loads((out / REPORT_NAME).read_text())
    assert report["ops"]["image"]["before"]["Mod"] == 2 and "Mod" not in report["ops"]["image"]["after"]
    assert any("bucket 1 only" in note for note in report["notes"])

    texts = tokenize(list(PARITY_SENTENCES[:3]))
    images = sample_images(3, 64, seed=2)
    with torch.no_grad():
        want = {
            "text": F.normalize(ref.encode_text(torch.from_numpy(texts)), dim=-1).numpy(),
            "image": F.normalize(ref.encode_image(torch.from_numpy(images)), dim=-1).numpy(),
        }
    for precision, threshold in (("fp32", 0.99999), ("fp16", 0.999)):
        for tower, inputs in (("text", texts), ("image", images)):
            session = ort.InferenceSession(
                str(manifest.graph_path(tower, precision, 1)), providers=["CPUExecutionProvider"]
            )
            assert session.get_outputs()[0].name == f"{tower}_features"
            got = np.concatenate([session.run(None, {tower: inputs[i : i + 1]})[0] for i in range(3)])
            np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
            assert (got * want[tower]).sum(1).min() >= threshold, (tower, precision)


def test_a_graph_with_a_free_batch_keeps_every_bucket(tmp_path: Path) -> None:
    export_like_cnclip(tmp_path / "dyn", dynamic_text_batch=True)
    out = tmp_path / "wrapped"
    result = runner.invoke(
        build_cli(), ["convert", "--from-cnclip-onnx", str(tmp_path / "dyn"), "--out", str(out), "--buckets", "1,4"]
    )
    assert result.exit_code == 0, result.output
    manifest = ModelManifest.load(out)
    assert manifest.towers["text"].buckets("fp32") == [1, 4]
    assert manifest.towers["image"].buckets("fp32") == [1]
    graph = onnx.load(str(manifest.graph_path("text", "fp32", 4)), load_external_data=False)
    assert [d.dim_value for d in graph.graph.input[0].type.tensor_type.shape.dim] == [4, 52]


def test_missing_files_are_named(tmp_path: Path) -> None:
    result = runner.invoke(build_cli(), ["convert", "--from-cnclip-onnx", str(tmp_path / "vit-b-16"), "--out", "x"])
    assert result.exit_code == 1
    assert "no Chinese-CLIP ONNX graph" in result.output and "vit-b-16.img.{fp16,fp32}.onnx" in result.output
