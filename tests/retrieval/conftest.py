"""Fixtures shared by several retrieval test modules (those every test module uses are in tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny official-format checkpoint (`checkpoint`), its config JSON (`config`) and their folder (`root`),
    from a cn_clip reference model with fp16-exact weights."""
    import torch  # here, not at the top: the retrieval tests that never convert do not pay for torch

    from tests.support.cnclip_models import TINY_VIT, official_checkpoint, reference_model

    root = tmp_path_factory.mktemp("tiny-ckpt")
    ref = reference_model(TINY_VIT, seed=3)
    with torch.no_grad():
        for p in ref.state_dict().values():
            if p.is_floating_point():
                p.copy_(p.half().float())
    checkpoint = official_checkpoint(ref, root / "tiny.pt")
    config = root / "tiny-vit.json"
    config.write_text(json.dumps(TINY_VIT), encoding="utf-8")
    return {"checkpoint": checkpoint, "config": config, "root": root}
