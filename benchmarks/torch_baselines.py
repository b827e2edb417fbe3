"""The fair PyTorch baseline: five ways to run a tower in PyTorch, each timed, the fastest reported.

A speed-up is only worth stating against the best PyTorch can do on the same machine, so the
baseline is not one configuration but the best of:

- `eager-fp32-1t`: the project's model (`retrieval.toolchain.convert.model`, the parity reference), fp32, 1 thread;
- `eager-fp32`: the same with `threads` threads (the old single baseline; its key is kept);
- `eager-bf16`: the same under `torch.autocast("cpu", dtype=torch.bfloat16)` (emulated on CPUs
  without AVX-512-BF16/AMX: it is timed anyway, so the table shows what it gives);
- `cnclip-fp32`: cn_clip's own `model.py` CLIP (nn.MultiheadAttention, so PyTorch's fused SDPA
  kernel), fp32, `threads` threads, holding the same weights as ours (a state-dict copy), so its
  cosine against `eager-fp32` shows it computes the same thing;
- `dynamic-int8`: the project's model after the one line PyTorch offers for int8 on CPU,
  `torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)` (int8 weights, each
  batch's activations quantized on the fly), `threads` threads. Our attention computes q, k, v with
  `F.linear` on slices of one packed weight (model.py), so those three stay fp32: the one line quantizes
  every `nn.Linear` and no more. Its cosine against `eager-fp32` is what that int8 costs.

Every runner takes the tower's numpy input ([b, 3, R, R] float32 or [b, L] int64 ids; any L up to the
model's position table) and returns L2-normalised features. Each sets its own thread count before it
runs, so runners can be interleaved in any order.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from retrieval.manifest import ModelManifest
from retrieval.toolchain.convert.checkpoint import build_model, vary_constant_parameters
from retrieval.toolchain.convert.cnclip_reference import cnclip_model
from retrieval.toolchain.convert.model import CLIP, architecture_config

Runner = Callable[[np.ndarray], np.ndarray]
BEST = "best PyTorch"


@dataclass(frozen=True)
class Baseline:
    key: str
    label: str
    run: Runner


def model_config(manifest: ModelManifest) -> dict[str, Any] | None:
    """The architecture of a converted model directory: the config `cnclip convert` stored, else the
    released architecture its name gives, else None (e.g. the toy model, which has no torch twin)."""
    config = manifest.extra.get("config")
    if isinstance(config, dict):
        return config
    try:
        return architecture_config(manifest.arch)
    except ValueError:
        return None


def random_model(config: dict[str, Any], seed: int = 0) -> CLIP:
    """The weights `cnclip convert --random-init --seed SEED` gives, so torch and the graphs agree."""
    torch.manual_seed(seed)
    return vary_constant_parameters(build_model(config))


def cnclip_twin(model: CLIP) -> nn.Module:
    """cn_clip's CLIP with `model`'s weights: same names, so only cn_clip's extras may be missing."""
    twin = cnclip_model(model.config)
    result = twin.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in result.missing_keys if not k.startswith("bert.pooler.")]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"cn_clip's CLIP does not take our weights: missing {missing}, extra {result.unexpected_keys}"
        )
    return twin.eval()


def dynamic_int8(model: CLIP) -> nn.Module:
    """A copy of `model` with every `nn.Linear` dynamically quantized to int8 (the model is left as it is)."""
    # torch.ao.quantization is deprecated in favour of torchao (not a dependency here) but still works in
    # the pinned 2.13: the warnings say so on every call, which would bury the benchmark's own lines.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*", category=UserWarning)
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8).eval()


def _runner(encode: Callable[[torch.Tensor], torch.Tensor], threads: int, bf16: bool = False) -> Runner:
    def run(x: np.ndarray) -> np.ndarray:
        torch.set_num_threads(threads)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            features = encode(torch.from_numpy(x))
        return F.normalize(features.float(), dim=-1).numpy()

    return run


def torch_baselines(model: CLIP, tower: str, threads: int, which: str = "all") -> list[Baseline]:
    """The five PyTorch runners of `tower` (`which`: comma-separated keys, or "all")."""
    twin = cnclip_twin(model) if which == "all" or "cnclip-fp32" in which else None
    quantized = dynamic_int8(model) if which == "all" or "dynamic-int8" in which else None
    ours = model.encode_image if tower == "image" else model.encode_text
    options = [
        Baseline("eager-fp32-1t", "PyTorch eager fp32, 1 thread", _runner(ours, 1)),
        Baseline("eager-fp32", f"PyTorch eager fp32, {threads} threads", _runner(ours, threads)),
        Baseline("eager-bf16", f"PyTorch bf16 autocast, {threads} threads", _runner(ours, threads, bf16=True)),
    ]
    if twin is not None:
        theirs = twin.encode_image if tower == "image" else twin.encode_text
        options.append(Baseline("cnclip-fp32", f"cn_clip's model fp32, {threads} threads", _runner(theirs, threads)))
    if quantized is not None:
        int8 = quantized.encode_image if tower == "image" else quantized.encode_text
        options.append(Baseline("dynamic-int8", f"PyTorch dynamic int8, {threads} threads", _runner(int8, threads)))
    if threads == 1:
        options = [o for o in options if o.key != "eager-fp32-1t"]  # the same runner twice
    chosen = {k.strip() for k in which.split(",")} if which != "all" else None
    return [o for o in options if chosen is None or o.key in chosen or o.key == "eager-fp32"]


def cosines_vs_eager(baselines: list[Baseline], x: np.ndarray) -> dict[str, float]:
    """Each baseline's lowest row cosine against `eager-fp32` on `x` (what its speed costs in answers)."""
    reference = next(b for b in baselines if b.key == "eager-fp32").run(x)
    return {b.key: float((b.run(x) * reference).sum(axis=1).min()) for b in baselines}


def best_of(rates: dict[str, float]) -> tuple[str, float]:
    """(key, rate) of the fastest baseline in `rates` (items/s by baseline key)."""
    key = max(rates, key=lambda k: rates[k])
    return key, rates[key]
