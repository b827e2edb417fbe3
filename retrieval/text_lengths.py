"""Text length buckets: the seed's static graphs in shape buckets ("分档静态图"), applied to sequence length.

Token ids come from the tokenizer zero-padded to the model's full context length (52). Most queries
are far shorter ("穿红色裙子的女孩" is 10 tokens with [CLS] and [SEP]), and a text graph's cost
grows with its length, so a model directory may carry text graphs at shorter lengths too (16, 32
and 52 by default, see `cnclip convert --text-lengths`). A row runs in the shortest graph that
holds all its tokens.

Cutting the padding off is exact: padding (id 0) is masked out of attention, and every position
a real token sees is the same in a shorter graph. So a row's vector does not depend on the length
it ran at (the converter's parity gate and the tests check it).

Where a stream runs any length (ONNX Runtime's one shape-dynamic session over several length
graphs, retrieval/backends/ort_batch.py), a group is cut tighter still, to its longest row: a
10-token query runs at 10, not 16 (issue 34: the padding was up to 40 % of a short query's work).
Exact in fp32; dynamic int8 takes its activation ranges over the whole batch, padding included, so
a vector moves by as little as it does with its batchmates (tests/retrieval/test_tight_text.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from retrieval.errors import ModelError

PAD_ID = 0
# The narrowest tight width: [CLS] and [SEP], what the tokenizer gives the empty text.
MIN_TIGHT_WIDTH = 2


def used_lengths(ids: np.ndarray) -> np.ndarray:
    """Per row, the number of leading positions that hold anything but padding (last non-zero + 1)."""
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"token ids must be 2-D (rows, length), got shape {ids.shape}")
    if ids.shape[1] == 0:
        return np.zeros(len(ids), dtype=np.int64)
    nonzero = ids != PAD_ID
    last = ids.shape[1] - np.argmax(nonzero[:, ::-1], axis=1)
    return np.where(nonzero.any(axis=1), last, 0).astype(np.int64)


def shortest_length(used: int, lengths: Sequence[int]) -> int:
    """The smallest of `lengths` (sorted ascending) that holds `used` tokens."""
    for length in lengths:
        if length >= used:
            return length
    raise ModelError(f"{used} tokens do not fit the longest text graph ({lengths[-1]})")


def served_width(length: int, lengths: Sequence[int]) -> int:
    """The width a session that runs any length is timed at for one length bucket (`cnclip tune`):
    the middle of the widths that bucket's rows take (more tokens than the next shorter bucket holds,
    at most its own length) — with buckets 16 and 52, 9 and 35 tokens. A static session of the
    bucket pads every row to `length`; timing both at `length` charged the one session for padding it
    never runs (issue 34: 16-token text cases read 11–14 % slower there than served)."""
    shorter = [n for n in lengths if n < length]
    least = max(shorter) + 1 if shorter else MIN_TIGHT_WIDTH
    return (least + length + 1) // 2


def split_by_length(
    ids: np.ndarray, lengths: Sequence[int], tight: bool = False
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Group rows by the shortest length that holds them: [(row indices, ids cut to that length)].

    Groups come shortest first; each group's ids are a contiguous int64 array of shape (k, length),
    or with `tight` (a session that runs any length) (k, its longest row, at least MIN_TIGHT_WIDTH).
    """
    used = used_lengths(ids)
    chosen = np.array([shortest_length(int(u), lengths) for u in used], dtype=np.int64)
    groups = []
    for length in sorted(set(chosen.tolist())):
        rows = np.flatnonzero(chosen == length)
        width = min(length, max(int(used[rows].max()), MIN_TIGHT_WIDTH)) if tight else length
        groups.append((rows, np.ascontiguousarray(ids[rows, :width], dtype=np.int64)))
    return groups


def parse_lengths(values: Sequence[int], context_length: int) -> list[int]:
    """Sorted, distinct lengths between 2 ([CLS] and [SEP]) and `context_length`, which is always included."""
    bad = [v for v in values if not 2 <= v <= context_length]
    if bad:
        raise ModelError(
            f"text lengths must lie between 2 and the context length {context_length}; got {', '.join(map(str, bad))}"
        )
    return sorted({*values, context_length})
