"""Read Chinese-CLIP checkpoints safely and load them into `retrieval.toolchain.convert.model.CLIP`.

Official checkpoints are `{"state_dict": {...}, "epoch": ..., ...}` with keys that may start with
`module.` (saved from DistributedDataParallel) and weights usually in fp16. They are read with
`torch.load(weights_only=True)`: tensors and plain containers only, never arbitrary pickled objects.
A checkpoint may carry its own architecture under `"config"` (cn_clip merged keys); the project's
demo trainer writes one so that `cnclip convert --checkpoint` needs no `--arch`.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from retrieval.errors import InvalidInput, ModelError
from retrieval.json_text import loads
from retrieval.toolchain.convert.model import CLIP

StateDict = dict[str, torch.Tensor]


def clean_state_dict(state_dict: dict[str, Any]) -> StateDict:
    """Strip DDP's `module.` prefix, drop cn_clip's unused `bert.pooler.*`, cast floating tensors to fp32."""
    cleaned: StateDict = {}
    for key, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            continue
        name = key.removeprefix("module.")
        if name.startswith("bert.pooler."):
            continue
        cleaned[name] = value.float() if value.is_floating_point() else value
    return cleaned


def load_checkpoint(path: Path) -> tuple[dict[str, Any] | None, StateDict]:
    """Read a checkpoint file; returns (embedded config or None, cleaned state dict)."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"checkpoint not found: {path}")
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError) as exc:
        # weights_only refuses pickled code; torch reports that (and truncated files) as these errors.
        raise ModelError(f"{path} is not a loadable checkpoint (torch.load weights_only): {exc}") from exc
    if not isinstance(raw, dict):
        raise ModelError(f"{path}: expected a dict with 'state_dict', got {type(raw).__name__}")
    state = raw.get("state_dict", raw)
    if not isinstance(state, dict) or not any(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelError(f"{path}: no tensors under 'state_dict'")
    config = raw.get("config")
    if config is not None and not isinstance(config, dict):
        raise ModelError(f"{path}: 'config' must be a dict of cn_clip model config keys")
    return config, clean_state_dict(state)


def vary_constant_parameters(model: CLIP, std: float = 0.02) -> CLIP:
    """Add noise to parameters whose values are all equal (zero biases, unit LayerNorm weights).

    A randomly initialised model has those where a trained one never does, and the simplifier
    folds them away (a zero bias Add disappears, equal LayerNorm weights are shared), so the graph
    would not have a real checkpoint's structure. `--random-init` uses this so that benchmarks time
    the same graph a released checkpoint gives.
    """
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for param in model.parameters():
            flat = param.reshape(-1)
            if flat.numel() > 1 and bool((flat == flat[0]).all()):
                param.add_(torch.randn(param.shape, generator=generator) * std)
    return model


def build_model(config: dict[str, Any], state_dict: StateDict | None = None) -> CLIP:
    """The CLIP architecture of `config`, with `state_dict` loaded strictly (random weights when None)."""
    try:
        model = CLIP.from_config(config)
    except (KeyError, ValueError, TypeError) as exc:
        raise ModelError(f"bad model config: {exc}") from exc
    if state_dict is not None:
        expected = model.state_dict()
        missing = sorted(set(expected) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(expected))
        wrong = sorted(k for k in expected if k in state_dict and state_dict[k].shape != expected[k].shape)
        if missing or unexpected or wrong:
            parts = []
            for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
                if keys:
                    parts.append(f"{len(keys)} {label} (e.g. {', '.join(keys[:3])})")
            raise ModelError(
                "checkpoint does not match the architecture: " + "; ".join(parts) + ". Check --arch / --config."
            )
        model.load_state_dict(state_dict, strict=True)
    return model.eval()


def model_from_options(
    arch: str | None, config_path: Path | None, checkpoint: Path | None, random_init: bool, seed: int
) -> tuple[CLIP, str, dict[str, Any]]:
    """`cnclip convert`'s model: (the CLIP, its architecture name, where its weights came from), from
    exactly one of a checkpoint or random weights, and an architecture named by `--arch`, read from
    `--config` or carried by the checkpoint. `InvalidInput` says which option is missing or wrong."""
    from retrieval.toolchain.convert import ARCH_NAMES
    from retrieval.toolchain.convert.model import architecture_config

    if arch and not config_path and arch not in ARCH_NAMES:  # before the checkpoint: the option that is wrong
        raise InvalidInput(f"unknown architecture {arch!r} (--arch); choose one of {', '.join(ARCH_NAMES)}")
    if (checkpoint is None) == (not random_init):
        raise InvalidInput("give exactly one of --checkpoint FILE.pt or --random-init (or --from-cnclip-onnx PREFIX)")
    if arch and config_path:
        raise InvalidInput("give --arch or --config, not both")
    embedded, state = load_checkpoint(checkpoint) if checkpoint else (None, None)
    if config_path:
        try:
            config = loads(config_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise InvalidInput(f"cannot read --config {config_path}: {exc}") from exc
        arch_name = config_path.stem
    elif arch:
        try:
            config = architecture_config(arch)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from exc
        arch_name = arch
    elif embedded is not None:
        config, arch_name = embedded, str(embedded.get("name", "custom"))
    else:
        raise InvalidInput(f"give --arch ({', '.join(ARCH_NAMES)}) or --config FILE.json")
    torch.manual_seed(seed)
    model = build_model(config, state)
    if random_init:
        vary_constant_parameters(model)
    return model, arch_name, {"checkpoint": checkpoint.name if checkpoint else None, "random_init": random_init}
