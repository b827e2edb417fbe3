"""Tiny cn_clip models for the conversion tests: a ViT configuration small enough to convert in seconds, the
official cn_clip model built from it (randomly initialised), saved as Chinese-CLIP's training saves it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from retrieval.toolchain.convert.cnclip_reference import load_cnclip_model_module

TINY_VIT: dict[str, Any] = {
    "embed_dim": 32,
    "image_resolution": 64,
    "vision_layers": 2,
    "vision_width": 64,
    "vision_head_width": 32,
    "vision_patch_size": 32,
    "vocab_size": 21128,
    "text_attention_probs_dropout_prob": 0.1,
    "text_hidden_act": "gelu",
    "text_hidden_dropout_prob": 0.1,
    "text_hidden_size": 64,
    "text_initializer_range": 0.02,
    "text_intermediate_size": 128,
    "text_max_position_embeddings": 64,
    "text_num_attention_heads": 2,
    "text_num_hidden_layers": 2,
    "text_type_vocab_size": 2,
}


def reference_model(config: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    """cn_clip's CLIP for `config`, randomly initialised (fp32, eval)."""
    ref = load_cnclip_model_module()
    kwargs = dict(config)
    if isinstance(kwargs["vision_layers"], str):
        kwargs["vision_layers"] = eval(kwargs["vision_layers"])  # cn_clip's own parsing of "[1,1,1,1]"
    torch.manual_seed(seed)
    model = ref.CLIP(**kwargs)
    # Give BatchNorm statistics and zero-initialised weights real values so the comparison means something.
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point() and ("running_var" in name or name.endswith("bn3.weight")):
                tensor.uniform_(0.5, 1.5)
            elif tensor.is_floating_point() and "running_mean" in name:
                tensor.normal_(0, 0.1)
    return model.float().eval()


def official_checkpoint(model: torch.nn.Module, path: Path, prefix: str = "module.", fp16: bool = True) -> Path:
    """Save `model` the way Chinese-CLIP's training does: DDP prefix, fp16 weights, pooler kept."""
    state = {}
    for key, value in model.state_dict().items():
        if "num_batches_tracked" not in key and fp16 and value.is_floating_point():
            value = value.half()
        state[prefix + key] = value
    bert_config: Any = model.bert_config  # cn_clip's CLIP keeps its BertConfig as a plain attribute
    hidden = int(bert_config.hidden_size)
    state[prefix + "bert.pooler.dense.weight"] = torch.zeros(hidden, hidden)
    state[prefix + "bert.pooler.dense.bias"] = torch.zeros(hidden)
    torch.save({"epoch": 3, "step": 100, "name": "tiny", "state_dict": state}, path)
    return path


def sample_inputs(config: dict[str, Any], batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` random images and token rows (lengths 5, 20, 52: [CLS] … [SEP], then padding) for `config`."""
    generator = torch.Generator().manual_seed(1)
    r = config["image_resolution"]
    image = torch.randn(batch, 3, r, r, generator=generator)
    text = torch.randint(100, 21000, (batch, 52), generator=generator)
    text[:, 0] = 101  # [CLS]
    for i, length in enumerate((5, 20, 52)[:batch]):
        text[i, length - 1] = 102  # [SEP]
        text[i, length:] = 0
    return image, text
