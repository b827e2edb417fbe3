"""`retrieval.toolchain.convert.model` computes what cn_clip's own model.py computes, from the same state dict.

cn_clip is imported by file path (`retrieval.toolchain.convert.cnclip_reference`: its package __init__ needs
torchvision); these tests prove that the official parameter names load strictly and that both towers
give the same numbers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from retrieval.errors import ModelError
from retrieval.toolchain.convert.checkpoint import build_model, load_checkpoint
from retrieval.toolchain.convert.cnclip_reference import load_cnclip_model_module
from retrieval.toolchain.convert.model import ARCHITECTURES, CLIP, architecture_config

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
TINY_RN: dict[str, Any] = {
    **TINY_VIT,
    "vision_layers": "[1,1,1,1]",
    "vision_width": 8,
    "vision_head_width": 64,
    "vision_patch_size": None,
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
    hidden = model.bert_config.hidden_size
    state[prefix + "bert.pooler.dense.weight"] = torch.zeros(hidden, hidden)
    state[prefix + "bert.pooler.dense.bias"] = torch.zeros(hidden)
    torch.save({"epoch": 3, "step": 100, "name": "tiny", "state_dict": state}, path)
    return path


def sample_inputs(config: dict[str, Any], batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    r = config["image_resolution"]
    image = torch.randn(batch, 3, r, r, generator=generator)
    text = torch.randint(100, 21000, (batch, 52), generator=generator)
    text[:, 0] = 101  # [CLS]
    for i, length in enumerate((5, 20, 52)[:batch]):
        text[i, length - 1] = 102  # [SEP]
        text[i, length:] = 0
    return image, text


@pytest.mark.parametrize("config", [TINY_VIT, TINY_RN], ids=["vit", "resnet"])
def test_official_state_dict_loads_strictly_and_matches_cnclip(config: dict[str, Any], tmp_path: Path) -> None:
    ref = reference_model(config)
    with torch.no_grad():  # released weights are fp16: round first so both sides hold identical values
        for p in ref.state_dict().values():
            if p.is_floating_point():
                p.copy_(p.half().float())
    ckpt = official_checkpoint(ref, tmp_path / "tiny.pt")
    embedded, state = load_checkpoint(ckpt)
    assert embedded is None
    assert not any(k.startswith(("module.", "bert.pooler")) for k in state)
    ours = build_model(config, state)
    image, text = sample_inputs(config)
    with torch.no_grad():
        ref_image, ref_text = ref.encode_image(image), ref.encode_text(text)
        our_image, our_text = ours.encode_image(image), ours.encode_text(text)
    assert our_image.shape == (3, config["embed_dim"])
    torch.testing.assert_close(our_image, ref_image, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(our_text, ref_text, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.logit_scale, ref.logit_scale.float())


def test_padding_is_masked_like_cnclip() -> None:
    model = CLIP.from_config(TINY_VIT)
    _, text = sample_inputs(TINY_VIT, batch=1)  # 5 real tokens, then padding
    changed = text.clone()
    changed[0, 10] = 0  # still padding: no change
    with torch.no_grad():
        torch.testing.assert_close(model.encode_text(text), model.encode_text(changed))
        changed[0, 2] = 555  # a real token changes the features
        assert not torch.allclose(model.encode_text(text), model.encode_text(changed))


def test_mismatched_checkpoint_names_the_keys(tmp_path: Path) -> None:
    ckpt = official_checkpoint(reference_model(TINY_VIT), tmp_path / "tiny.pt")
    _, state = load_checkpoint(ckpt)
    with pytest.raises(ModelError, match=r"missing .*Check --arch"):
        build_model({**TINY_VIT, "vision_layers": 3}, state)


def test_unsafe_pickle_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"state_dict": {"x": torch.zeros(1)}, "hook": Path("/etc/passwd")}, path)
    with pytest.raises(ModelError, match="weights_only"):
        load_checkpoint(path)


def test_released_architectures_match_cnclip_configs() -> None:
    import json

    spec = importlib.util.find_spec("cn_clip")
    assert spec is not None and spec.origin is not None
    configs = Path(spec.origin).parent / "clip" / "model_configs"
    text_of = {"RN50": "RBT3-chinese", "ViT-H-14": "RoBERTa-wwm-ext-large-chinese"}
    for arch in ARCHITECTURES:
        merged = json.loads((configs / f"{arch}.json").read_text())
        merged.update(json.loads((configs / f"{text_of.get(arch, 'RoBERTa-wwm-ext-base-chinese')}.json").read_text()))
        if isinstance(merged["vision_layers"], str):
            merged["vision_layers"] = json.loads(merged["vision_layers"])
        assert architecture_config(arch) == merged, arch


def test_checkpoint_may_carry_its_config(tmp_path: Path) -> None:
    """The demo trainer saves {"state_dict", "config"}, so a checkpoint alone rebuilds its model."""
    model = CLIP.from_config(TINY_VIT)
    torch.save({"state_dict": model.state_dict(), "config": TINY_VIT}, tmp_path / "demo.pt")
    config, state = load_checkpoint(tmp_path / "demo.pt")
    assert config == TINY_VIT
    rebuilt = build_model(config, state)
    _, text = sample_inputs(TINY_VIT, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.encode_text(text), model.encode_text(text))


def test_random_init_has_no_constant_parameters() -> None:
    """Zero biases / unit LayerNorm weights would be folded away, unlike in a trained checkpoint's graph."""
    from retrieval.toolchain.convert.checkpoint import vary_constant_parameters

    model = CLIP.from_config(TINY_VIT)
    constant = [n for n, p in model.named_parameters() if p.numel() > 1 and bool((p == p.reshape(-1)[0]).all())]
    assert "bert.encoder.layer.0.attention.self.query.bias" in constant
    vary_constant_parameters(model)
    assert not [n for n, p in model.named_parameters() if p.numel() > 1 and bool((p == p.reshape(-1)[0]).all())]
