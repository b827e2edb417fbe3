"""What a stored or queried vector is: float32 rows of one collection's dimension, finite, of unit
length (cosine = inner product in every engine). The encoder normalises (retrieval/types.py
`Encoder`: the one L2 normalisation of the add and search paths); storage checks its vectors here
and divides only a caller's of another length (a test's, a benchmark's), never the encoder's again."""

from __future__ import annotations

import numpy as np

from retrieval.errors import InvalidInput

UNIT_TOLERANCE = 1e-5  # |norm - 1| of a vector taken as unit length: float32 rounding of a normalised one


def unit_vectors(vectors: np.ndarray, count: int, dim: int) -> np.ndarray:
    """`vectors` as `count` contiguous float32 rows of `dim` and unit length; `InvalidInput` for
    another shape, a non-finite value or a zero vector. Rows of unit length already are returned as
    they are."""
    array = np.asarray(vectors, dtype=np.float32)
    if array.shape != (count, dim):
        raise InvalidInput(f"expected vectors of shape ({count}, {dim}), got {array.shape}")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    if not np.all(np.isfinite(array)) or np.any(norms == 0):
        raise InvalidInput("vectors must be finite and non-zero")
    if np.all(np.abs(norms - 1.0) <= UNIT_TOLERANCE):
        return np.ascontiguousarray(array)
    return np.ascontiguousarray(array / norms, dtype=np.float32)
