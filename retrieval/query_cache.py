"""The query cache: text vectors the model already computed, answered again without the model.

Search queries repeat ("猫", "海边的日落"), and zero-shot classification embeds the same prompt
texts ("一张猫的照片", ...) for every image; a repeated text costs a lookup instead of a batch.

Keys are (model id, tower, the row's token ids without their trailing zero padding). The token
ids are the normalised text: two texts that tokenize identically ("猫 " and "猫", upper and lower
case, full-width spaces) are the same input to the model, so they share an entry, and texts the
model sees differently never do. No hand-written normalisation could be both as exact and as safe.
The model id (which fingerprints the model's files) in the key means an entry can never answer
for another model, even in a cache shared by two encoders; each encoder owns one anyway, built
from `CNCLIP_QUERY_CACHE_SIZE`, so a model change (a new encoder) starts with an empty cache.

An LRU of at most `size` vectors; `size` 0 disables it (no lookups, the counters stay 0). It is
used from one event loop with no await inside a lookup or a store, so it needs no lock; two
requests that miss the same text at the same moment both compute it (the later store keeps one).
Stored vectors are read-only copies: a caller that modifies a result cannot change the cache.
The zero-shot classifier keeps its label embeddings in a `QueryCache` of its own, keyed by
(model id, templates, label).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

import numpy as np

K = TypeVar("K", bound=Hashable)
TokenKey = tuple[str, str, bytes]  # (model id, tower, token ids as int64 bytes without trailing padding)


class QueryCache(Generic[K]):
    """An LRU of read-only float32 vectors with hit and miss counters (read by the service's metrics)."""

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError("the cache size must be 0 (disabled) or more")
        self.size = size
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[K, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, keys: Sequence[K]) -> tuple[dict[K, np.ndarray], list[K]]:
        """(the vectors it has, by key; the distinct keys it lacks, in first-seen order).

        Counts one miss per distinct key it lacks and one hit for every other key: a key repeated
        within `keys` is computed once, so its repeats are served without the model as well.
        """
        if self.size == 0:
            return {}, list(dict.fromkeys(keys))
        found: dict[K, np.ndarray] = {}
        missing: dict[K, None] = {}
        for key in keys:
            if key in found or key in missing:
                continue
            vector = self._entries.get(key)
            if vector is None:
                missing[key] = None
            else:
                self._entries.move_to_end(key)
                found[key] = vector
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        return found, list(missing)

    def store(self, keys: Sequence[K], vectors: np.ndarray) -> None:
        """Keep a read-only copy of each vector, evicting the least recently used beyond `size`."""
        if self.size == 0:
            return
        for key, vector in zip(keys, vectors, strict=True):
            kept = np.array(vector, dtype=np.float32)  # a copy, never a view of the caller's array
            kept.flags.writeable = False
            self._entries[key] = kept
            self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


def token_keys(model_id: str, tower: str, ids: np.ndarray) -> list[TokenKey]:
    """The cache key of each token-id row: its ids as int64 bytes, trailing zero padding trimmed."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    nonzero = ids != 0
    # Each row's length up to its last non-zero id (0 for a row of zeros).
    lengths = np.where(nonzero.any(axis=1), ids.shape[1] - np.argmax(nonzero[:, ::-1], axis=1), 0)
    return [(model_id, tower, ids[row, :length].tobytes()) for row, length in enumerate(lengths.tolist())]


async def embed_with_cache(
    cache: QueryCache[TokenKey],
    model_id: str,
    tower: str,
    ids: np.ndarray,
    compute: Callable[[np.ndarray], Awaitable[np.ndarray]],
) -> np.ndarray:
    """float32 (n, dim) for token-id rows `ids`, in their order: cached rows from `cache`, the rest
    from one `compute(rows)` call over the distinct rows the cache lacks (whose vectors it keeps)."""
    if cache.size == 0 or ids.ndim != 2 or len(ids) == 0:
        return await compute(ids)  # nothing to look up: compute answers (or rejects a malformed batch)
    keys = token_keys(model_id, tower, ids)
    found, missing = cache.lookup(keys)
    if missing:
        first_row = {key: row for row, key in reversed(list(enumerate(keys)))}
        computed = np.asarray(await compute(ids[[first_row[key] for key in missing]]), dtype=np.float32)
        cache.store(missing, computed)
        found.update(zip(missing, computed, strict=True))
    return np.stack([found[key] for key in keys])  # a new array: the cache's copies stay untouched
