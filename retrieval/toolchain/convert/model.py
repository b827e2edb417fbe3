"""The CN-CLIP architecture in plain torch, with cn_clip's module and parameter names.

An official Chinese-CLIP checkpoint (`{"state_dict": {...}}`) loads into `CLIP` with strict key
checking. The layers compute what cn_clip's `model.py` computes (same formulas, same epsilons,
same -10000 attention-mask bias), but written batch-first with explicit attention so that the
exported ONNX graph is small and has fixed shapes: no `nn.MultiheadAttention` (whose export adds
the shape arithmetic and `Mod` nodes the seed article had to fold away), no token-type or
position-id inputs.

Configs use cn_clip's merged keys (vision json + text json of `cn_clip/clip/model_configs`);
`ARCHITECTURES` holds the five released ones.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from retrieval.toolchain.convert.model_text import PAD_ID, BertModel, attend

__all__ = ["ARCHITECTURES", "CLIP", "CONTEXT_LENGTH", "PAD_ID", "BertModel", "architecture_config"]

_ROBERTA_BASE = {
    "vocab_size": 21128,
    "text_attention_probs_dropout_prob": 0.1,
    "text_hidden_act": "gelu",
    "text_hidden_dropout_prob": 0.1,
    "text_hidden_size": 768,
    "text_initializer_range": 0.02,
    "text_intermediate_size": 3072,
    "text_max_position_embeddings": 512,
    "text_num_attention_heads": 12,
    "text_num_hidden_layers": 12,
    "text_type_vocab_size": 2,
}
_ROBERTA_LARGE = {
    **_ROBERTA_BASE,
    "text_hidden_size": 1024,
    "text_intermediate_size": 4096,
    "text_num_attention_heads": 16,
    "text_num_hidden_layers": 24,
}
_RBT3 = {**_ROBERTA_BASE, "text_num_hidden_layers": 3}

# The released checkpoints' configs, as cn_clip merges them (`{vision}@{text}` in cn_clip/clip/utils.py).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "RN50": {
        "embed_dim": 1024,
        "image_resolution": 224,
        "vision_layers": [3, 4, 6, 3],
        "vision_width": 64,
        "vision_patch_size": None,
        **_RBT3,
    },
    "ViT-B-16": {
        "embed_dim": 512,
        "image_resolution": 224,
        "vision_layers": 12,
        "vision_width": 768,
        "vision_patch_size": 16,
        **_ROBERTA_BASE,
    },
    "ViT-L-14": {
        "embed_dim": 768,
        "image_resolution": 224,
        "vision_layers": 24,
        "vision_width": 1024,
        "vision_patch_size": 14,
        **_ROBERTA_BASE,
    },
    "ViT-L-14-336": {
        "embed_dim": 768,
        "image_resolution": 336,
        "vision_layers": 24,
        "vision_width": 1024,
        "vision_patch_size": 14,
        **_ROBERTA_BASE,
    },
    "ViT-H-14": {
        "embed_dim": 1024,
        "image_resolution": 224,
        "vision_layers": 32,
        "vision_width": 1280,
        "vision_head_width": 80,
        "vision_patch_size": 14,
        **_ROBERTA_LARGE,
    },
}

CONTEXT_LENGTH = 52  # cn_clip.clip.tokenize's default: [CLS] + 50 tokens + [SEP]


# ----------------------------------------------------------------------------- vision: ViT


class LayerNorm(nn.LayerNorm):
    """cn_clip's LayerNorm: computed in fp32 whatever the input dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float()).to(x.dtype)


class QuickGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class MultiheadSelfAttention(nn.Module):
    """Parameters named like `nn.MultiheadAttention` (in_proj_weight, out_proj), batch-first forward."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * width, width))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * width))
        self.out_proj = nn.Linear(width, width)
        nn.init.xavier_uniform_(self.in_proj_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Three projections from slices of the packed weight: the slices fold into three constant
        # weights at export, and ORT's attention fusion recognises separate q/k/v MatMuls.
        w, b = self.in_proj_weight, self.in_proj_bias
        d = w.shape[1]
        q = F.linear(x, w[:d], b[:d])
        k = F.linear(x, w[d : 2 * d], b[d : 2 * d])
        v = F.linear(x, w[2 * d :], b[2 * d :])
        return self.out_proj(attend(q, k, v, self.heads, None))


class ResidualAttentionBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.attn = MultiheadSelfAttention(width, heads)
        self.ln_1 = LayerNorm(width)
        self.mlp = nn.Sequential(
            OrderedDict(
                [("c_fc", nn.Linear(width, width * 4)), ("gelu", QuickGELU()), ("c_proj", nn.Linear(width * 4, width))]
            )
        )
        self.ln_2 = LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.resblocks = nn.Sequential(*[ResidualAttentionBlock(width, heads) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resblocks(x)


class VisualTransformer(nn.Module):
    def __init__(self, input_resolution: int, patch_size: int, width: int, layers: int, heads: int, output_dim: int):
        super().__init__()
        self.input_resolution = input_resolution
        self.conv1 = nn.Conv2d(3, width, kernel_size=patch_size, stride=patch_size, bias=False)
        scale = width**-0.5
        grid = input_resolution // patch_size
        self.class_embedding = nn.Parameter(scale * torch.randn(width))
        self.positional_embedding = nn.Parameter(scale * torch.randn(grid * grid + 1, width))
        self.ln_pre = LayerNorm(width)
        self.transformer = Transformer(width, layers, heads)
        self.ln_post = LayerNorm(width)
        self.proj = nn.Parameter(scale * torch.randn(width, output_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x).flatten(2).transpose(1, 2)  # [b, grid**2, width]
        cls = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1) + self.positional_embedding.to(x.dtype)
        x = self.transformer(self.ln_pre(x))
        return self.ln_post(x[:, 0, :]) @ self.proj


# ----------------------------------------------------------------------------- vision: ModifiedResNet


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.avgpool = nn.AvgPool2d(stride) if stride > 1 else nn.Identity()
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU()
        self.downsample: nn.Module | None = None
        if stride > 1 or inplanes != planes * self.expansion:
            self.downsample = nn.Sequential(
                OrderedDict(
                    [
                        ("-1", nn.AvgPool2d(stride)),
                        ("0", nn.Conv2d(inplanes, planes * self.expansion, 1, stride=1, bias=False)),
                        ("1", nn.BatchNorm2d(planes * self.expansion)),
                    ]
                )
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(self.avgpool(out)))
        identity = self.downsample(x) if self.downsample is not None else x
        return self.relu(out + identity)


class AttentionPool2d(nn.Module):
    """CLIP's attention pooling; only the pooled (mean) token's query is computed, as only it is returned."""

    def __init__(self, spacial_dim: int, embed_dim: int, num_heads: int, output_dim: int) -> None:
        super().__init__()
        self.positional_embedding = nn.Parameter(torch.randn(spacial_dim**2 + 1, embed_dim) / embed_dim**0.5)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.c_proj = nn.Linear(embed_dim, output_dim)
        self.num_heads = num_heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(2).transpose(1, 2)  # [b, hw, c]
        x = torch.cat([x.mean(dim=1, keepdim=True), x], dim=1) + self.positional_embedding.to(x.dtype)
        q = self.q_proj(x[:, :1])
        out = attend(q, self.k_proj(x), self.v_proj(x), self.num_heads, None)
        return self.c_proj(out[:, 0])


class ModifiedResNet(nn.Module):
    def __init__(self, layers: list[int], output_dim: int, heads: int, input_resolution: int, width: int) -> None:
        super().__init__()
        self.input_resolution = input_resolution
        self.conv1 = nn.Conv2d(3, width // 2, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width // 2)
        self.conv2 = nn.Conv2d(width // 2, width // 2, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width // 2)
        self.conv3 = nn.Conv2d(width // 2, width, kernel_size=3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(width)
        self.avgpool = nn.AvgPool2d(2)
        self.relu = nn.ReLU()
        self._inplanes = width
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(width * 8, layers[3], stride=2)
        self.attnpool = AttentionPool2d(input_resolution // 32, width * 32, heads, output_dim)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        layers = [Bottleneck(self._inplanes, planes, stride)]
        self._inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self._inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, bn in ((self.conv1, self.bn1), (self.conv2, self.bn2), (self.conv3, self.bn3)):
            x = self.relu(bn(conv(x)))
        x = self.avgpool(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.attnpool(x)


# ----------------------------------------------------------------------------- CLIP


def normalize_config(config: dict[str, Any]) -> dict[str, Any]:
    """Validate a cn_clip-style merged config; `vision_layers` may be cn_clip's string form "[3,4,6,3]"."""
    required = (
        *("embed_dim", "image_resolution", "vision_layers", "vision_width", "vocab_size", "text_hidden_size"),
        *("text_num_hidden_layers", "text_num_attention_heads", "text_intermediate_size"),
    )
    missing = [k for k in required if k not in config]
    if missing:
        raise ValueError(f"model config lacks {', '.join(missing)} (use cn_clip's merged vision+text keys)")
    cfg = {
        "text_hidden_act": "gelu",
        "text_max_position_embeddings": 512,
        "text_type_vocab_size": 2,
        "vision_head_width": 64,
        "vision_patch_size": None,
        **config,
    }
    layers = cfg["vision_layers"]
    if isinstance(layers, str):
        layers = json.loads(layers)
    if isinstance(layers, list | tuple):
        if len(layers) != 4:
            raise ValueError(f"ResNet vision_layers needs 4 stage depths, got {layers}")
        cfg["vision_layers"] = [int(n) for n in layers]
    else:
        cfg["vision_layers"] = int(layers)
        if not cfg["vision_patch_size"]:
            raise ValueError("a ViT config (integer vision_layers) needs vision_patch_size")
    return cfg


class CLIP(nn.Module):
    """CN-CLIP: `visual` (ViT or ModifiedResNet), `bert`, `text_projection`, `logit_scale` (log of the multiplier)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        cfg = normalize_config(config)
        self.config = cfg
        embed_dim = cfg["embed_dim"]
        width = cfg["vision_width"]
        self.visual: VisualTransformer | ModifiedResNet
        if isinstance(cfg["vision_layers"], list):
            self.visual = ModifiedResNet(
                cfg["vision_layers"], embed_dim, width * 32 // cfg["vision_head_width"], cfg["image_resolution"], width
            )
        else:
            self.visual = VisualTransformer(
                cfg["image_resolution"],
                cfg["vision_patch_size"],
                width,
                cfg["vision_layers"],
                width // cfg["vision_head_width"],
                embed_dim,
            )
        self.bert = BertModel(cfg)
        hidden = cfg["text_hidden_size"]
        self.text_projection = nn.Parameter(torch.randn(hidden, embed_dim) * hidden**-0.5)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CLIP:
        """Build the architecture (random weights, eval mode) from a cn_clip merged config."""
        return cls(config).eval()

    @property
    def image_resolution(self) -> int:
        return int(self.config["image_resolution"])

    @property
    def embed_dim(self) -> int:
        return int(self.config["embed_dim"])

    def encode_image(self, image: torch.Tensor) -> torch.Tensor:
        """Unnormalised image features [b, embed_dim] from preprocessed float images [b, 3, R, R]."""
        return self.visual(image.to(self.visual.conv1.weight.dtype))

    def encode_text(self, text: torch.Tensor) -> torch.Tensor:
        """Unnormalised text features [b, embed_dim] from token ids int64 [b, 52] (0 = padding)."""
        return self.bert(text)[:, 0, :] @ self.text_projection

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normalised image and text features and the logit multiplier, like cn_clip's CLIP.forward."""
        image_features = F.normalize(self.encode_image(image), dim=-1)
        text_features = F.normalize(self.encode_text(text), dim=-1)
        return image_features, text_features, self.logit_scale.exp()


def architecture_config(arch: str) -> dict[str, Any]:
    """The merged config of a released architecture name (RN50, ViT-B-16, ...)."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")
    return dict(ARCHITECTURES[arch])
