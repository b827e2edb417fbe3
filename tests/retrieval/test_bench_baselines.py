"""benchmarks/torch_baselines.py: the five PyTorch baselines compute the same features as the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from benchmarks.torch_baselines import best_of, cosines_vs_eager, dynamic_int8, random_model, torch_baselines
from tests.support.cnclip_models import TINY_VIT, sample_inputs


@pytest.mark.parametrize("tower", ["image", "text"])
def test_every_baseline_matches_eager_fp32_and_cn_clip_holds_our_weights(tower: str) -> None:
    model = random_model(TINY_VIT, seed=5)
    image, text = sample_inputs(TINY_VIT)
    x = (image if tower == "image" else text[:, :20]).numpy()  # text at a shorter length than 52, as --text-length
    baselines = {b.key: b for b in torch_baselines(model, tower, threads=2)}
    assert set(baselines) == {"eager-fp32-1t", "eager-fp32", "eager-bf16", "cnclip-fp32", "dynamic-int8"}
    reference = baselines["eager-fp32"].run(x)
    assert reference.shape == (3, TINY_VIT["embed_dim"])
    for key, baseline in baselines.items():
        cosine = (baseline.run(x) * reference).sum(axis=1).min()
        # cn_clip's model is a different implementation: only a weight copy makes it agree to fp32 rounding.
        assert cosine > (0.99 if key in ("eager-bf16", "dynamic-int8") else 0.99999), key


@pytest.mark.parametrize("tower", ["image", "text"])
def test_dynamic_int8_differs_from_fp32_by_what_cosines_vs_eager_reports(tower: str) -> None:
    model = random_model(TINY_VIT, seed=5)
    image, text = sample_inputs(TINY_VIT)
    x = (image if tower == "image" else text).numpy()
    baselines = torch_baselines(model, tower, threads=2, which="dynamic-int8")
    cosine = cosines_vs_eager(baselines, x)
    by_key = {b.key: b for b in baselines}
    direct = (by_key["dynamic-int8"].run(x) * by_key["eager-fp32"].run(x)).sum(axis=1).min()
    assert cosine["eager-fp32"] == pytest.approx(1.0, abs=1e-6)
    assert cosine["dynamic-int8"] == pytest.approx(float(direct), abs=1e-7)
    assert 0.99 < cosine["dynamic-int8"] < 0.9999999, "int8 weights must move the vectors a little, not at all"


def test_dynamic_int8_quantizes_every_linear_of_a_copy() -> None:
    model = random_model(TINY_VIT)
    quantized = dynamic_int8(model)
    linears = [name for name, m in model.named_modules() if type(m) is nn.Linear]
    int8 = {name for name, m in quantized.named_modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)}
    assert linears and set(linears) == int8
    assert all(type(m) is not torch.ao.nn.quantized.dynamic.Linear for m in model.modules())  # the model is kept


def test_one_thread_is_not_timed_twice_and_a_subset_keeps_the_reference() -> None:
    model = random_model(TINY_VIT)
    assert [b.key for b in torch_baselines(model, "image", threads=1)] == [
        "eager-fp32",
        "eager-bf16",
        "cnclip-fp32",
        "dynamic-int8",
    ]
    assert [b.key for b in torch_baselines(model, "image", threads=2, which="eager-bf16")] == [
        "eager-fp32",
        "eager-bf16",
    ]


def test_best_of_is_the_fastest() -> None:
    assert best_of({"eager-fp32": 2.0, "cnclip-fp32": 3.5, "eager-bf16": np.float64(0.5)}) == ("cnclip-fp32", 3.5)
