"""The shipped demo model (`models/cnclip-demo`): size, format, and held-out quality on ONNX Runtime.

The numbers are recomputed with `demo.evaluate` (the script behind the model card) and must hold
the floors below; they must also equal the numbers the model card was written from.
"""

from __future__ import annotations

import json

import pytest

from demo.evaluate import evaluate
from retrieval.config import SHIPPED_MODEL_DIR
from retrieval.manifest import ModelManifest

CARD_NUMBERS = SHIPPED_MODEL_DIR / "eval.json"
# The targets. The shipped model measures fp32 0.890 / 0.982 / 0.914 / 0.992 / 1.000 and
# int8 top-10 overlap 0.981 (MODEL_CARD.md); the evaluation is deterministic, so a model that falls
# below a target fails here rather than on a user's machine.
FLOORS = {
    "t2i_r1": 0.8,
    "t2i_r5": 0.95,
    "i2t_r1": 0.8,
    "zeroshot_shape_acc": 0.9,
    "zeroshot_colour_acc": 0.9,
}
INT8_OVERLAP_FLOOR = 0.98


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, float]]:
    return evaluate(SHIPPED_MODEL_DIR, n=500)


def test_shipped_model_is_small_verified_and_cn_clip_shaped() -> None:
    manifest = ModelManifest.load(SHIPPED_MODEL_DIR)  # verifies every sha256
    total = sum((SHIPPED_MODEL_DIR / name).stat().st_size for name in manifest.files)
    assert total <= 15 * 1000 * 1000
    assert manifest.name == "cnclip-demo"
    assert manifest.image_size == 224 and manifest.context_length == 52
    config = manifest.extra["config"]
    assert config["vocab_size"] == 21128 and isinstance(config["vision_layers"], int)
    for tower in ("image", "text"):
        assert manifest.towers[tower].precisions() == ["fp32", "int8"]
    assert (SHIPPED_MODEL_DIR / "MODEL_CARD.md").is_file()


def test_heldout_quality_holds_its_floors(results: dict[str, dict[str, float]]) -> None:
    for precision in ("fp32", "int8"):
        for key, floor in FLOORS.items():
            assert results[precision][key] >= floor, (precision, key, results[precision])
    assert results["int8"]["top10_overlap_vs_fp32"] >= INT8_OVERLAP_FLOOR
    assert results["_benchmark"]["gallery"] == 500


def test_model_card_numbers_come_from_the_script(results: dict[str, dict[str, float]]) -> None:
    recorded = json.loads(CARD_NUMBERS.read_text(encoding="utf-8"))
    card = (SHIPPED_MODEL_DIR / "MODEL_CARD.md").read_text(encoding="utf-8")
    for precision in ("fp32", "int8"):
        for key, value in results[precision].items():
            assert recorded[precision][key] == pytest.approx(value, abs=0.005), (precision, key)
            assert f"{recorded[precision][key]:.3f}" in card, (precision, key)
