"""Export one tower of a `CLIP` to a fixed-shape ONNX graph (seed steps 1 and 2).

Each graph takes `image` float32 [b, 3, R, R] or `text` int64 [b, L] (L = 52, or a shorter length
bucket) and returns the tower's unnormalised features (`RAW_OUTPUT_NAMES`); the pipeline appends
the float32 L2 normalisation that produces `image_features` / `text_features` after choosing the
precision. No scalar `logit_scale` output: it goes into the manifest. Every bucket is exported at
its own batch size (and length), so every shape in the graph is a constant and the simplifier can
fold all shape arithmetic away.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn

from retrieval.errors import ModelError
from retrieval.toolchain.convert.model import CLIP, CONTEXT_LENGTH

OPSET = 17  # ≥ 14 as the seed needs; 17 has LayerNormalization as one op
TOWERS = ("image", "text")
INPUT_NAMES = {"image": "image", "text": "text"}
OUTPUT_NAMES = {"image": "image_features", "text": "text_features"}
RAW_OUTPUT_NAMES = {"image": "unnorm_image_features", "text": "unnorm_text_features"}


class ImageTower(nn.Module):
    """`image` [b, 3, R, R] → unnormalised image features [b, d]."""

    def __init__(self, model: CLIP) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(image)


class TextTower(nn.Module):
    """`text` int64 [b, L] (L = 52 or a shorter length bucket) → unnormalised text features [b, d]."""

    def __init__(self, model: CLIP) -> None:
        super().__init__()
        self.model = model

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        return self.model.encode_text(text)


def tower_module(model: CLIP, tower: str) -> nn.Module:
    """The module a tower's graph is exported from (also the parity reference)."""
    return (ImageTower if tower == "image" else TextTower)(model).eval()


def example_input(model: CLIP, tower: str, batch: int, length: int = CONTEXT_LENGTH) -> torch.Tensor:
    if tower == "image":
        r = model.image_resolution
        return torch.zeros(batch, 3, r, r, dtype=torch.float32)
    ids = torch.zeros(batch, length, dtype=torch.int64)
    ids[:, 0], ids[:, 1] = 101, 102  # [CLS] [SEP]
    return ids


def export_tower(
    model: CLIP, tower: str, batch: int, opset: int = OPSET, length: int = CONTEXT_LENGTH
) -> onnx.ModelProto:
    """The raw (unsimplified) graph of `tower` at batch size `batch` (text: `length` tokens), weights included."""
    if tower not in TOWERS:
        raise ValueError(f"unknown tower {tower!r}")
    module = tower_module(model, tower)
    with tempfile.TemporaryDirectory(prefix="cnclip-export-") as tmp:
        path = Path(tmp) / f"{tower}.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            # The TorchScript exporter warns about Python floats in traced code; shapes are fixed on purpose.
            warnings.simplefilter("ignore")
            try:
                torch.onnx.export(
                    module,
                    (example_input(model, tower, batch, length),),
                    str(path),
                    input_names=[INPUT_NAMES[tower]],
                    output_names=[RAW_OUTPUT_NAMES[tower]],
                    opset_version=opset,
                    dynamo=False,
                    # Leave folding to the simplifier so the report shows what it removed.
                    do_constant_folding=False,
                )
            except (RuntimeError, torch.onnx.errors.OnnxExporterError) as exc:
                raise ModelError(f"ONNX export of the {tower} tower (batch {batch}) failed: {exc}") from exc
        # Loads external data too, which torch writes beside the graph for models over 2 GB.
        return onnx.load(str(path))
