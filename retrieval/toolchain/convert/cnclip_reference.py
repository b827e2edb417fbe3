"""cn_clip's own `model.py`, loaded by file path: the parity reference and a PyTorch baseline.

`cn_clip/__init__.py` and `cn_clip/clip/__init__.py` import torchvision (for the image transform), and
no torchvision build matches the project's torch. The model module itself needs only torch, its BERT
modules and the package's `_tokenizer` (for the `[PAD]` id), so the package is stubbed with just that
while `configuration_bert`, `modeling_bert` and `model` are executed from their files. cn_clip is a
development dependency (`make install` adds it with --no-deps); serving never imports this module.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
import types
from pathlib import Path
from typing import Any

from torch import nn

from retrieval.errors import ModelError
from retrieval.toolchain.convert.model import PAD_ID

MODULE_KEY = "cnclip_reference_model"


def load_cnclip_model_module() -> types.ModuleType:
    """cn_clip/clip/model.py as a module (cached in sys.modules), without importing torchvision."""
    if MODULE_KEY in sys.modules:
        return sys.modules[MODULE_KEY]
    spec = importlib.util.find_spec("cn_clip")
    if spec is None or spec.origin is None:
        raise ModelError("cn_clip is not installed (make install adds cn_clip==1.6.0 with --no-deps)")
    clip_dir = Path(spec.origin).parent / "clip"
    package = types.ModuleType("cn_clip.clip")
    package.__path__ = [str(clip_dir)]
    package._tokenizer = types.SimpleNamespace(vocab={"[PAD]": PAD_ID})  # type: ignore[attr-defined]
    saved = sys.modules.get("cn_clip.clip")
    sys.modules["cn_clip.clip"] = package
    try:
        for name in ("configuration_bert", "modeling_bert", "model"):
            full = f"cn_clip.clip.{name}"
            module_spec = importlib.util.spec_from_file_location(full, clip_dir / f"{name}.py")
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[full] = module
            module_spec.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop("cn_clip.clip", None)
        else:
            sys.modules["cn_clip.clip"] = saved
    sys.modules[MODULE_KEY] = module
    return module


def cnclip_model(config: dict[str, Any]) -> nn.Module:
    """cn_clip's CLIP for a merged config (random init, fp32, eval); keys cn_clip does not take are dropped."""
    reference = load_cnclip_model_module()
    accepted = inspect.signature(reference.CLIP).parameters
    kwargs = {k: v for k, v in config.items() if k in accepted and k != "tokenizer"}
    if isinstance(kwargs.get("vision_layers"), str):
        kwargs["vision_layers"] = json.loads(kwargs["vision_layers"])  # cn_clip's "[3,4,6,3]" form
    return reference.CLIP(**kwargs).float().eval()
