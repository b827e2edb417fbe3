"""`cnclip convert --precision ...,int8-qdq`: NNCF-calibrated int8 graphs for OpenVINO, the quality gate
for every engine × precision recorded in the manifest, a refused tower removed, and the runtime running
the int8 graphs on OpenVINO within the gate of fp32."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from api.config import Settings
from cli.main import build_cli
from retrieval.encoder import LocalEncoder
from retrieval.manifest import ModelManifest
from retrieval.toolchain import gate
from tests.support.tuning_files import tuning_for

runner = CliRunner()


def convert(tiny: dict[str, Path], out: Path, *extra: str) -> None:
    result = runner.invoke(
        build_cli(),
        ["convert", "--config", str(tiny["config"]), "--checkpoint", str(tiny["checkpoint"]), "--out", str(out)]
        + ["--buckets", "1,2", "--text-lengths", "16,52", "--precision", "fp32,int8,int8-qdq", *extra],
    )
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def qdq_model(tiny: dict[str, Path]) -> Path:
    texts = tiny["root"] / "captions.txt"
    texts.write_text("\n".join(f"第{i}张照片里有一只猫和{i}个苹果" for i in range(20)), encoding="utf-8")
    out = tiny["root"] / "qdq"
    convert(tiny, out, "--calibration-texts", str(texts))
    return out


def test_int8_qdq_graphs_are_calibrated_static_int8(qdq_model: Path) -> None:
    manifest = ModelManifest.load(qdq_model)
    report = json.loads((qdq_model / "convert-report.json").read_text())
    passed = {
        (r["precision"], r["tower"]): r["passed"]
        for r in manifest.extra["gate"]["results"]
        if r["backend"] == "openvino"
    }
    # The tiny random model's text int8 passes; its image tower (48 near-identical parity pictures, so
    # the top-10 order is fragile) may not, and then its int8-qdq graphs are gone, as the gate says.
    assert passed["int8", "text"]
    for tower in ("image", "text"):
        if not passed["int8", tower]:
            assert "int8-qdq" not in manifest.towers[tower].precisions()
            assert f"{tower} int8-qdq graphs refused by the gate and removed" in report["notes"]
            continue
        graph = onnx.load(str(manifest.graph_path(tower, "int8-qdq", 2)), load_external_data=False)
        ops = {n.op_type for n in graph.graph.node}
        assert {"QuantizeLinear", "DequantizeLinear"} <= ops and "DynamicQuantizeLinear" not in ops
    assert manifest.text_lengths("int8-qdq") == [16, 52]
    assert "int8-qdq calibrated on 20 texts from" in "\n".join(report["notes"])
    assert "int8-qdq calibrated on 64 synthetic pictures" in "\n".join(report["notes"])


def test_the_gate_ran_for_every_engine_and_precision_and_is_recorded(qdq_model: Path) -> None:
    record = ModelManifest.load(qdq_model).extra["gate"]
    assert record["min_cosine"] == gate.MIN_COSINE and record["min_top10_overlap"] == gate.MIN_TOP10
    assert record["min_batch_cosine"] == gate.MIN_BATCH_COSINE
    keys = {(r["backend"], r["precision"], r["tower"]) for r in record["results"]}
    for tower in ("image", "text"):
        assert {("onnxruntime", "int8", tower), ("onnxruntime", "fp32", tower), ("openvino", "int8", tower)} <= keys
        assert ("openvino", "fp32", tower) in keys
    for result in record["results"]:
        # The gate judges the top-10 agreement up to ties; the strict overlap is reported beside it
        # and can only be lower (a tie counted as agreeing is never a disagreement counted as one).
        assert result["top10_agreement"] >= result["top10_overlap"]
        assert result["passed"] == (
            result["min_cosine"] >= gate.MIN_COSINE
            and result["top10_agreement"] >= gate.MIN_TOP10
            and result["batch_cosine"] >= gate.MIN_BATCH_COSINE
        )
        # buckets 1 and 2: every result that ran compared batch 2 with batch 1 (fp32 does not move)
        if result["shapes"]:
            assert 0.99 < result["batch_cosine"] <= 1.0000001
        if result["precision"] == "fp32":
            assert result["batch_cosine"] >= 0.99999


def test_openvino_int8_serves_within_the_gate_of_fp32(qdq_model: Path, settings: Settings, tmp_path: Path) -> None:
    """Text int8 on OpenVINO beside the image tower on ONNX Runtime fp32: one tuning file, two engines."""

    async def vectors(**update: object) -> tuple[np.ndarray, dict[str, str]]:
        encoder = LocalEncoder(settings.model_copy(update={"model_dir": qdq_model, "buckets": [1, 2], **update}))
        await encoder.start()
        try:
            texts = await encoder.embed_texts(list(gate.PARITY_SENTENCES[:6]))
            reported = encoder._pools["text"].streams[0].session.engine_precisions()
            plans = {t: f"{p.backend.name} {p.precision}" for t, p in encoder.plans.items()}
            return texts, {"graph": encoder.plans["text"].graph, "reported": ",".join(reported), **plans}
        finally:
            await encoder.close()

    tuning = tmp_path / "tuning.json"
    text = {"backend": "openvino", "device": "CPU", "precision": "int8"}
    tuning.write_text(json.dumps(tuning_for(qdq_model, text=text, image={"precision": "fp32"})))
    reference, _ = asyncio.run(vectors(precision="fp32", backend="onnxruntime"))
    int8, facts = asyncio.run(vectors(precision="auto", tuning_file=tuning))
    assert facts == {
        "graph": "int8-qdq",
        "reported": "int8 (rest f32)",
        "text": "openvino int8",
        "image": "onnxruntime fp32",
    }
    assert gate.cosines(int8, reference).min() >= gate.MIN_COSINE


def test_a_tower_that_fails_the_gate_is_refused_and_removed(
    tiny: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gate, "MIN_COSINE", 0.9999999)  # stricter than any int8 graph can be
    out = tmp_path / "strict"
    convert(tiny, out)
    manifest = ModelManifest.load(out)
    for tower in ("image", "text"):
        assert "int8-qdq" not in manifest.towers[tower].precisions()
        assert not list(out.glob(f"{tower}.int8-qdq.*"))
    results = manifest.extra["gate"]["results"]
    refused = {(r["backend"], r["precision"], r["tower"]) for r in results if not r["passed"]}
    assert ("openvino", "int8", "image") in refused and ("onnxruntime", "int8", "text") in refused
    assert ("onnxruntime", "fp32", "text") not in refused
    report = json.loads((out / "convert-report.json").read_text())
    assert "image int8-qdq graphs refused by the gate and removed" in report["notes"]
