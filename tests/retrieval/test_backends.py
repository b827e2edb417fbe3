"""The backend registry: selection and fallback, OpenVINO absent, the quality gate's refusals, and the
same answers from every backend on the toy model (within the gate)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from api.config import Settings
from retrieval.backends import BACKENDS, DEFAULT_BACKEND, backend_named
from retrieval.backends import openvino as ov_backend
from retrieval.encoder import LocalEncoder
from retrieval.errors import EncoderUnavailable, ModelError
from retrieval.manifest import MANIFEST_NAME, ModelManifest
from retrieval.toolchain.gate import MIN_COSINE, cosines, judge
from retrieval.toolchain.toy_model import write_toy_model

TEXTS = ["穿红色裙子的女孩", "一只橘猫趴在窗台上晒太阳", "猫", "海边的日落，天空被染成了橙色"]


def started(settings: Settings) -> dict[str, object]:
    async def main() -> dict[str, object]:
        encoder = LocalEncoder(settings)
        await encoder.start()
        try:
            texts = await encoder.embed_texts(TEXTS)
            pixels = np.random.default_rng(0).standard_normal((3, 3, 224, 224)).astype(np.float32)
            images = await encoder.embed_pixels(pixels)
            plans = {t: (p.backend.name, p.device.name, p.precision, p.graph) for t, p in encoder.plans.items()}
            reported = {t: encoder._pools[t].streams[0].session.engine_precisions() for t in encoder.plans}
        finally:
            await encoder.close()
        return {"texts": texts, "images": images, "plans": plans, "reported": reported}

    return asyncio.run(main())


@pytest.fixture
def no_openvino(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import openvino` fails, as on an install without the extra."""
    monkeypatch.setitem(sys.modules, "openvino", None)
    ov_backend._core.cache_clear()
    yield
    ov_backend._core.cache_clear()


def test_the_registry_has_onnxruntime_first_and_openvino() -> None:
    assert [b.name for b in BACKENDS] == ["onnxruntime", "openvino"]
    assert DEFAULT_BACKEND.name == "onnxruntime"
    with pytest.raises(ModelError, match="known: onnxruntime, openvino"):
        backend_named("tensorrt")


def test_auto_without_a_tuning_file_is_todays_onnxruntime_int8(settings: Settings, caplog) -> None:
    caplog.set_level(logging.INFO, logger="retrieval")
    result = started(settings)
    assert result["plans"] == {
        "image": ("onnxruntime", "cpu", "int8", "int8"),
        "text": ("onnxruntime", "cpu", "int8", "int8"),
    }
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("no tuning file at") and "cnclip tune --model" in line for line in lines)


def test_openvino_absent_is_detected_and_an_explicit_choice_fails_clearly(settings: Settings, no_openvino) -> None:
    found = backend_named("openvino").detect()
    assert not found.found and "not installed" in found.reason
    with pytest.raises(EncoderUnavailable, match="openvino is not usable here: openvino is not installed"):
        started(settings.model_copy(update={"backend": "openvino"}))
    # auto never needs it
    assert started(settings)["plans"]["text"][0] == "onnxruntime"


def test_openvino_runs_the_toy_model_with_the_precision_pinned_and_reported(settings: Settings) -> None:
    reference = started(settings.model_copy(update={"precision": "fp32", "backend": "onnxruntime"}))
    ov = started(settings.model_copy(update={"precision": "fp32", "backend": "openvino"}))
    assert ov["plans"]["text"] == ("openvino", "CPU", "fp32", "fp32")
    assert ov["reported"] == {"image": ["f32"], "text": ["f32"]}  # read back from the compiled models
    for key in ("texts", "images"):
        assert cosines(ov[key], reference[key]).min() > 0.99999


@pytest.mark.skipif("BF16" not in ov_backend.capabilities("CPU"), reason="this CPU computes no bf16")
def test_openvino_bf16_stays_within_the_gate_of_fp32(settings: Settings) -> None:
    reference = started(settings.model_copy(update={"precision": "fp32", "backend": "onnxruntime"}))
    bf16 = started(settings.model_copy(update={"precision": "bf16", "backend": "openvino"}))
    assert bf16["reported"] == {"image": ["bf16"], "text": ["bf16"]}
    for key in ("texts", "images"):
        assert cosines(bf16[key], reference[key]).min() >= MIN_COSINE


def test_onnxruntime_offers_no_bf16(settings: Settings) -> None:
    with pytest.raises(ModelError, match="CNCLIP_PRECISION=bf16: onnxruntime on cpu offers int8, fp32"):
        started(settings.model_copy(update={"precision": "bf16", "backend": "onnxruntime"}))


def _with_gate_record(directory: Path, results: list[dict[str, object]]) -> Path:
    write_toy_model(directory)
    manifest_path = directory / MANIFEST_NAME
    raw = json.loads(manifest_path.read_text())
    raw["extra"]["gate"] = {"results": results}
    manifest_path.write_text(json.dumps(raw))
    return directory


def test_a_tower_that_failed_the_gate_is_never_chosen(settings: Settings, tmp_path: Path) -> None:
    failed = {"backend": "onnxruntime", "precision": "int8", "tower": "text", "passed": False, "reason": "top-10 97%"}
    model = _with_gate_record(tmp_path / "model", [failed])
    result = started(settings.model_copy(update={"model_dir": model}))
    assert result["plans"]["text"][2] == "fp32"  # refused int8 → the next precision
    assert result["plans"]["image"][2] == "int8"  # the other tower keeps int8
    with pytest.raises(ModelError, match=r"quality gate refused text on onnxruntime \(top-10 97%\)"):
        started(settings.model_copy(update={"model_dir": model, "precision": "int8"}))


def test_gate_thresholds() -> None:
    assert judge("b", "int8", "text", [0.9995, 0.9992], [0.99, 1.0]).passed
    low = judge("b", "int8", "text", [0.9985], [1.0])
    assert not low.passed and "cosine 0.99850 < 0.999" in low.reason
    assert not judge("b", "int8", "image", [1.0], [0.97]).passed
    assert not judge("b", "int8", "image", [float("nan")], [1.0]).passed


def test_manifest_loads_with_a_gate_record(tmp_path: Path) -> None:
    model = _with_gate_record(tmp_path / "m", [{"backend": "x", "precision": "int8", "tower": "image", "passed": True}])
    assert ModelManifest.load(model).extra["gate"]["results"][0]["passed"] is True


def test_top10_agreement_forgives_swaps_of_near_ties_and_only_those() -> None:
    """One query, a 12-item gallery scored 0.30, 0.29, …: the candidate swaps the 10th with the 11th.
    A 0.0005 apart swap is a tie (agreement 1.0 although the strict overlap is 0.9); 0.01 apart is not."""
    from retrieval.toolchain.gate import topk_agreement, topk_overlap

    query = np.array([[1.0, 0.0]], dtype=np.float32)

    def gallery(scores: list[float]) -> np.ndarray:
        return np.array([[s, np.sqrt(1 - s * s)] for s in scores], dtype=np.float32)

    for gap, agrees in ((0.0005, True), (0.01, False)):
        ref_scores = [0.30 - 0.02 * i for i in range(9)] + [0.10, 0.10 - gap, 0.0]
        swapped = ref_scores[:9] + [ref_scores[10], ref_scores[9], 0.0]  # the candidate ranks the 11th above the 10th
        ref, cand = gallery(ref_scores), gallery(swapped)
        assert topk_overlap(query, ref, query, cand) == pytest.approx(0.9)
        assert topk_agreement(query, ref, query, cand) == pytest.approx(1.0 if agrees else 0.9)
    same = gallery([0.3 - 0.02 * i for i in range(12)])
    assert topk_agreement(query, same, query, same) == 1.0
    low = judge("b", "int8", "image", [1.0], [0.90], [0.99])
    assert low.passed and "strict overlap 90.0%" in low.line()
    assert not judge("b", "int8", "image", [1.0], [1.0], [0.97]).passed
