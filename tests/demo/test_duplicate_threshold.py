"""The duplicate thresholds are measured, not guessed where a measurement is possible: the demo model's
similar-shots cosine in retrieval/relevance.py is what `python -m demo.duplicate_threshold` measures on
the demo gallery, and the perceptual-hash threshold separates edits of a photo-like picture from other
pictures; other models say their threshold is not measured."""

from __future__ import annotations

import pytest

from demo.duplicate_threshold import cosine_threshold, hash_distances, measure_cosines, photo_like
from indexer.domain.perceptual import HAMMING_THRESHOLD
from retrieval.relevance import DUPLICATE_UNMEASURED, duplicate_threshold


def test_the_demo_threshold_is_the_measured_one() -> None:
    measured = measure_cosines(300, "int8")  # what a CPU serves (fp32 measures the same 0.88: the script's --precision)
    recorded, was_measured = duplicate_threshold("cnclip-demo@anything")
    assert was_measured and recorded == pytest.approx(measured["threshold"], abs=0.011)
    assert measured["other_scene_passing"] <= 0.05  # the rule it was chosen by
    assert measured["same_scene_recall"] >= 0.8  # and it still finds most other shots of a scene
    assert measured["edits_passing"]["jpeg_q40"] == 1.0 and measured["edits_passing"]["half"] == 1.0


def test_other_models_are_unmeasured() -> None:
    for model in ("cnclip-vit-b-16@abc", "cnclip-vit-h-14", "fake", "toy"):
        assert duplicate_threshold(model) == (DUPLICATE_UNMEASURED, False)


def test_the_hash_threshold_lies_between_edits_and_other_pictures() -> None:
    distances = hash_distances([photo_like(seed) for seed in range(40)])
    assert max(distances["edit_max"].values()) <= HAMMING_THRESHOLD  # type: ignore[union-attr]
    assert distances["distinct_min"] > HAMMING_THRESHOLD  # type: ignore[operator]


def test_the_rule_picks_the_lowest_threshold_with_few_false_groups() -> None:
    import numpy as np

    other = np.array([0.5] * 95 + [0.9] * 5)
    assert cosine_threshold(np.array([0.95]), other) == 0.51  # 5 % above is allowed
    other = np.array([0.5] * 94 + [0.9] * 6)
    assert cosine_threshold(np.array([0.95]), other) == 0.91
