"""Inputs that exercise a tower as real requests do, for tests that compare graphs or engines."""

from __future__ import annotations

import numpy as np


def varied_input(tower: str, batch: int, length: int, seed: int) -> np.ndarray:
    """Normalised-looking pixels, or token rows of varied lengths ([CLS] … [SEP], then padding)."""
    rng = np.random.default_rng(seed)
    if tower == "image":
        return rng.normal(0.0, 1.0, (batch, 3, 224, 224)).astype(np.float32)
    ids = rng.integers(103, 21128, (batch, length)).astype(np.int64)
    ids[:, 0] = 101
    for row, n in enumerate(rng.integers(3, length, batch)):  # texts of varied lengths, padded
        ids[row, n - 1], ids[row, n:] = 102, 0
    return ids
