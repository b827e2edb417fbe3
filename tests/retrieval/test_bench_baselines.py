"""benchmarks/torch_baselines.py: the four PyTorch baselines compute the same features as the reference."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.torch_baselines import best_of, random_model, torch_baselines
from tests.support.cnclip_models import TINY_VIT, sample_inputs


@pytest.mark.parametrize("tower", ["image", "text"])
def test_every_baseline_matches_eager_fp32_and_cn_clip_holds_our_weights(tower: str) -> None:
    model = random_model(TINY_VIT, seed=5)
    image, text = sample_inputs(TINY_VIT)
    x = (image if tower == "image" else text[:, :20]).numpy()  # text at a shorter length than 52, as --text-length
    baselines = {b.key: b for b in torch_baselines(model, tower, threads=2)}
    assert set(baselines) == {"eager-fp32-1t", "eager-fp32", "eager-bf16", "cnclip-fp32"}
    reference = baselines["eager-fp32"].run(x)
    assert reference.shape == (3, TINY_VIT["embed_dim"])
    for key, baseline in baselines.items():
        cosine = (baseline.run(x) * reference).sum(axis=1).min()
        # cn_clip's model is a different implementation: only a weight copy makes it agree to fp32 rounding.
        assert cosine > (0.99 if key == "eager-bf16" else 0.99999), key


def test_one_thread_is_not_timed_twice_and_a_subset_keeps_the_reference() -> None:
    model = random_model(TINY_VIT)
    assert [b.key for b in torch_baselines(model, "image", threads=1)] == ["eager-fp32", "eager-bf16", "cnclip-fp32"]
    assert [b.key for b in torch_baselines(model, "image", threads=2, which="eager-bf16")] == [
        "eager-fp32",
        "eager-bf16",
    ]


def test_best_of_is_the_fastest() -> None:
    assert best_of({"eager-fp32": 2.0, "cnclip-fp32": 3.5, "eager-bf16": np.float64(0.5)}) == ("cnclip-fp32", 3.5)
