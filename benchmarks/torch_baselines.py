"""The fair PyTorch baseline: four ways to run a tower in PyTorch, each timed, the fastest reported.

A speed-up is only worth stating against the best PyTorch can do on the same machine, so the
baseline is not one configuration but the best of:

- `eager-fp32-1t`: the project's model (`retrieval.toolchain.convert.model`, the parity reference), fp32, 1 thread;
- `eager-fp32`: the same with `threads` threads (the old single baseline; its key is kept);
- `eager-bf16`: the same under `torch.autocast("cpu", dtype=torch.bfloat16)` (emulated on CPUs
  without AVX-512-BF16/AMX: it is timed anyway, so the table shows what it gives);
- `cnclip-fp32`: cn_clip's own `model.py` CLIP (nn.MultiheadAttention, so PyTorch's fused SDPA
  kernel), fp32, `threads` threads, holding the same weights as ours (a state-dict copy), so its
  cosine against `eager-fp32` shows it computes the same thing.

Every runner takes the tower's numpy input ([b, 3, R, R] float32 or [b, L] int64 ids; any L up to the
model's position table) and returns L2-normalised features. Each sets its own thread count before it
runs, so runners can be interleaved in any order.
"""

from __future__ import annotations

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


def _runner(encode: Callable[[torch.Tensor], torch.Tensor], threads: int, bf16: bool = False) -> Runner:
    def run(x: np.ndarray) -> np.ndarray:
        torch.set_num_threads(threads)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            features = encode(torch.from_numpy(x))
        return F.normalize(features.float(), dim=-1).numpy()

    return run


def torch_baselines(model: CLIP, tower: str, threads: int, which: str = "all") -> list[Baseline]:
    """The four PyTorch runners of `tower` (`which`: comma-separated keys, or "all")."""
    twin = cnclip_twin(model) if which == "all" or "cnclip-fp32" in which else None
    ours = model.encode_image if tower == "image" else model.encode_text
    options = [
        Baseline("eager-fp32-1t", "PyTorch eager fp32, 1 thread", _runner(ours, 1)),
        Baseline("eager-fp32", f"PyTorch eager fp32, {threads} threads", _runner(ours, threads)),
        Baseline("eager-bf16", f"PyTorch bf16 autocast, {threads} threads", _runner(ours, threads, bf16=True)),
    ]
    if twin is not None:
        theirs = twin.encode_image if tower == "image" else twin.encode_text
        options.append(Baseline("cnclip-fp32", f"cn_clip's model fp32, {threads} threads", _runner(theirs, threads)))
    if threads == 1:
        options = [o for o in options if o.key != "eager-fp32-1t"]  # the same runner twice
    chosen = {k.strip() for k in which.split(",")} if which != "all" else None
    return [o for o in options if chosen is None or o.key in chosen or o.key == "eager-fp32"]


def best_of(rates: dict[str, float]) -> tuple[str, float]:
    """(key, rate) of the fastest baseline in `rates` (items/s by baseline key)."""
    key = max(rates, key=lambda k: rates[k])
    return key, rates[key]
