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
from retrieval.toolchain.convert.model import ARCHITECTURES, CLIP, architecture_config
from tests.support.cnclip_models import TINY_VIT, official_checkpoint, reference_model, sample_inputs

TINY_RN: dict[str, Any] = {
    **TINY_VIT,
    "vision_layers": "[1,1,1,1]",
    "vision_width": 8,
    "vision_head_width": 64,
    "vision_patch_size": None,
}


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
