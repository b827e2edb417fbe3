"""The text tower of `retrieval.toolchain.convert.model.CLIP`: cn_clip's BERT (RoBERTa-wwm-ext) with
its module and parameter names, and the attention both towers write out (so that it exports plainly)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PAD_ID = 0  # '[PAD]' in cn_clip's vocab.txt


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, bias: torch.Tensor | None) -> torch.Tensor:
    """Scaled dot-product attention on batch-first [b, n, d] tensors, written out so it exports plainly."""
    b, nq, d = q.shape
    nk = k.shape[1]
    hd = d // heads
    q = q.reshape(b, nq, heads, hd).transpose(1, 2)
    k = k.reshape(b, nk, heads, hd).transpose(1, 2)
    v = v.reshape(b, nk, heads, hd).transpose(1, 2)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
    if bias is not None:
        scores = scores + bias
    out = torch.matmul(scores.softmax(dim=-1), v)
    return out.transpose(1, 2).reshape(b, nq, d)


# ----------------------------------------------------------------------------- text: BERT (RoBERTa-wwm-ext)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,  # the erf form, as cn_clip's modeling_bert.gelu
    "gelu_new": _gelu_tanh,
    "relu": F.relu,
    "swish": F.silu,
}


class BertEmbeddings(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, max_positions: int, type_vocab_size: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden, padding_idx=PAD_ID)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # Positions are 0..n-1 and every token type is 0, so both are constant slices, not graph inputs.
        n = ids.shape[1]
        x = self.word_embeddings(ids) + self.position_embeddings.weight[:n] + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"text hidden size {hidden} is not a multiple of {heads} attention heads")
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)


class BertSelfOutput(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)


class BertAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.self = BertSelfAttention(hidden, heads)
        self.output = BertSelfOutput(hidden)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        s = self.self
        context = attend(s.query(x), s.key(x), s.value(x), s.heads, mask_bias)
        return self.output.LayerNorm(self.output.dense(context) + x)


class BertIntermediate(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"unknown text_hidden_act {act!r}; known: {', '.join(ACTIVATIONS)}")
        self.dense = nn.Linear(hidden, intermediate)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertOutput(nn.Module):
    def __init__(self, intermediate: int, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(intermediate, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, act: str) -> None:
        super().__init__()
        self.attention = BertAttention(hidden, heads)
        self.intermediate = BertIntermediate(hidden, intermediate, act)
        self.output = BertOutput(intermediate, hidden)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask_bias)
        return self.output.LayerNorm(self.output.dense(self.intermediate(x)) + x)


class BertEncoder(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, intermediate: int, act: str) -> None:
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(hidden, heads, intermediate, act) for _ in range(layers)])


class BertModel(nn.Module):
    """cn_clip's BertModel without the pooler (cn_clip drops `bert.pooler.*` too)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        hidden = config["text_hidden_size"]
        self.embeddings = BertEmbeddings(
            config["vocab_size"], hidden, config["text_max_position_embeddings"], config["text_type_vocab_size"]
        )
        self.encoder = BertEncoder(
            config["text_num_hidden_layers"],
            hidden,
            config["text_num_attention_heads"],
            config["text_intermediate_size"],
            config["text_hidden_act"],
        )
        std = config.get("text_initializer_range", 0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                module.weight.data.normal_(0.0, std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.data.zero_()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Last hidden states [b, n, hidden]; padding (id 0) is masked with cn_clip's -10000 bias."""
        # Same order as cn_clip (unsqueeze, cast, 1 - m, × -10000): ORT's attention fusion knows this pattern.
        keep = ids.ne(PAD_ID)[:, None, None, :].to(self.embeddings.word_embeddings.weight.dtype)
        mask_bias = (1.0 - keep) * -10000.0
        x = self.embeddings(ids)
        for layer in self.encoder.layer:
            x = layer(x, mask_bias)
        return x
