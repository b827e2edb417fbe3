"""A perceptual hash of each image: the same picture re-encoded, resized or re-saved in another format
gets (nearly) the same 64 bits, so near-identical pictures are found by Hamming distance.

The hash (pHash, no dependency beyond numpy and Pillow): decode at full scale, as the encoder does
(`retrieval.preprocess.decode_image`), apply the EXIF orientation, greyscale, resize to 32×32 (a box
reduction by a power of two, then LANCZOS), take the 8×8 lowest frequencies of its 2-D DCT-II (two
matrix products), and set a bit for each coefficient above their median. Stored as a signed 64-bit
integer (`items.phash`, SQL has no unsigned BIGINT) with the `PHASH_VERSION` it was taken by
(`items.phash_version`); NULL for texts and for images indexed before revision 0004 until `cnclip
index` reads them.

Version 2 (revision 0009) decodes at full scale so that `cnclip index` and uploads take the hash from
the very decode the encoder's pixels come from (issue 34: the second decode cost 3.6 ms for a 1024×768
photo, 42 ms for a 12 MP one; hashing the shared decode 0.6 ms and 17 ms: benchmarks/bench_phash.py).
Version 1 decoded JPEGs at a reduced scale (1/2 to 1/8, Pillow's draft); the power-of-two box
reduction lands on the same grid, yet the same picture's two hashes can differ (0 bits for 160 of 200
photo-like JPEGs of random sizes, 2 for 38, 4 for 2), so a hash of another version is taken again by
`cnclip index` and `cnclip duplicates --hash-missing` (and compared as it is meanwhile:
docs/duplicates.md "After upgrading"). Hashing bytes alone (`phash_of_bytes`: those backfills, a
remote encoder's runs) costs a full decode now: 5.1 ms / 103 ms for those two photos.

`HAMMING_THRESHOLD` (bits) was measured by `python -m demo.duplicate_threshold`: on photo-like pictures
(1/f noise, the spectrum of natural photos) and the demo gallery, see docs/duplicates.md.

`near_pairs` finds every pair within the threshold without comparing all pairs (multi-index
hashing): split the 64 bits into four 16-bit blocks; two hashes within 7 bits agree on some block
up to one bit (pigeonhole), so each hash is looked up, per block, under its 17 one-bit-or-less
variants in a sorted array of that block's values, and only those candidates are compared in full.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from retrieval.errors import InvalidImage
from retrieval.preprocess import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, decode_image

PHASH_VERSION = 2  # how the stored hashes were taken (see above); a new definition takes the next number
HAMMING_THRESHOLD = 6  # bits (of 64): at most this far apart is "the same picture"
HASH_SIDE = 32  # pixels the DCT looks at
LOW_FREQUENCIES = 8  # 8×8 coefficients → 64 bits
_BLOCKS = 4  # multi-index hashing: 16-bit blocks, one flipped bit each → exact up to 7 bits
_MAX_EXACT = _BLOCKS * 2 - 1

_k = np.arange(HASH_SIDE)
# DCT-II basis rows for the lowest frequencies (the scale factors do not change which side of the median a
# coefficient falls on, except for the DC row, which is one of 64 and always above it either way).
_DCT = np.cos(np.pi * (2 * _k[None, :] + 1) * _k[:LOW_FREQUENCIES, None] / (2 * HASH_SIDE))


def phash_of_image(image: Image.Image) -> int:
    """The 64-bit perceptual hash of a decoded image, as a signed 64-bit integer."""
    grey = image.convert("L")
    if min(grey.size) >= 4 * HASH_SIDE:
        # A cheap box reduction first (LANCZOS straight from a full-size photo costs ~10x more), by a
        # power of two: a picture and its copy at half or double the size meet on the same grid (any
        # factor: up to 6 bits apart for double-size copies of photo-like pictures; this: 2).
        factor = 1 << ((min(grey.size) // (2 * HASH_SIDE)).bit_length() - 1)
        grey = grey.reduce(factor)
    pixels = np.asarray(grey.resize((HASH_SIDE, HASH_SIDE), Image.Resampling.LANCZOS), dtype=np.float64)
    low = _DCT @ pixels @ _DCT.T
    bits = (low > np.median(low)).ravel()
    return int(np.packbits(bits).view(">i8")[0])


def phash_or_none(image: Image.Image) -> int | None:
    """`phash_of_image`, or None for a mode Pillow cannot turn into greyscale."""
    try:
        return phash_of_image(image)
    except (OSError, ValueError):
        return None


def phash_of_bytes(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES, max_pixels: int = DEFAULT_MAX_PIXELS) -> int | None:
    """The perceptual hash of encoded image bytes, or None when they cannot be decoded (such an
    image is never embedded either, so nothing is lost). A caller that decodes the image anyway
    hashes its decode (`phash_or_none`): the value is the same."""
    try:
        image = decode_image(data, max_bytes, max_pixels)
    except InvalidImage:
        return None
    return phash_or_none(image)


_POPCOUNT16 = np.array([bin(i).count("1") for i in range(1 << 16)], dtype=np.uint8)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise distances between two arrays of 64-bit hashes (any integer dtype of 8 bytes)."""
    x = np.bitwise_xor(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
    return _POPCOUNT16[x.view(np.uint16).reshape(-1, 4)].sum(axis=1, dtype=np.int64)


def near_pairs(
    hashes: np.ndarray, threshold: int = HAMMING_THRESHOLD, bundle_cap: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """(pairs, distances): pairs of positions (i < j) whose hashes are at most `threshold` bits apart
    (at most 7), each pair once, without comparing all pairs.

    Work and memory stay linear in the number of hashes even when thousands are equal (blank or dark
    pictures share one hash): equal hashes are looked up once, and positions sharing a hash are paired
    within runs of `bundle_cap` (and across two near hashes, their first `bundle_cap` each), which is all
    that groups of at most `bundle_cap` members can use."""
    if not 0 <= threshold <= _MAX_EXACT:
        raise ValueError(f"threshold must be 0 to {_MAX_EXACT} bits")
    codes = np.ascontiguousarray(hashes, dtype=np.int64)
    values, inverse = np.unique(codes, return_inverse=True)
    order = np.argsort(inverse, kind="stable")  # positions grouped by value, in position order
    starts = np.searchsorted(inverse[order], np.arange(len(values)))
    sizes = np.diff(np.append(starts, len(codes)))
    near = _near_values(values, threshold)
    left: list[np.ndarray] = []
    right: list[np.ndarray] = []
    for value in np.flatnonzero(sizes > 1):  # positions sharing a hash: distance 0
        members = order[starts[value] : starts[value] + sizes[value]]
        for run in range(0, len(members), bundle_cap):
            a, b = np.triu_indices(len(members[run : run + bundle_cap]), 1)
            left.append(members[run + a])
            right.append(members[run + b])
    single = (sizes[near[:, 0]] == 1) & (sizes[near[:, 1]] == 1)
    left.append(order[starts[near[single, 0]]])
    right.append(order[starts[near[single, 1]]])
    for u, v in near[~single]:
        a = order[starts[u] : starts[u] + min(sizes[u], bundle_cap)]
        b = order[starts[v] : starts[v] + min(sizes[v], bundle_cap)]
        left.append(np.repeat(a, len(b)))
        right.append(np.tile(b, len(a)))
    i = np.concatenate(left) if left else np.empty(0, np.int64)
    j = np.concatenate(right) if right else np.empty(0, np.int64)
    pairs = np.stack([np.minimum(i, j), np.maximum(i, j)], axis=1).astype(np.int64)
    return pairs, hamming(codes[pairs[:, 0]], codes[pairs[:, 1]])


_PROBE_CHUNK = 1 << 22  # candidate pairs compared per step: bounds memory on skewed hash values


def _near_values(values: np.ndarray, threshold: int) -> np.ndarray:
    """Pairs of indices (u < v) of distinct hash values at most `threshold` bits apart (multi-index
    hashing over four 16-bit blocks)."""
    n = len(values)
    if n < 2:
        return np.empty((0, 2), dtype=np.int64)
    flips = np.array([0] + ([1 << bit for bit in range(16)] if threshold >= _BLOCKS else []), dtype=np.uint16)
    found: list[np.ndarray] = []
    for block in range(_BLOCKS):
        blocks = (values.view(np.uint64) >> np.uint64(16 * block)).astype(np.uint16)
        order = np.argsort(blocks, kind="stable")
        sorted_blocks = blocks[order]
        for flip in flips:
            keys = blocks ^ flip
            first = np.searchsorted(sorted_blocks, keys, "left")
            counts = np.searchsorted(sorted_blocks, keys, "right") - first
            ends = np.cumsum(counts)
            query = 0
            while query < n:  # queries in steps of at most _PROBE_CHUNK candidates (one query at least)
                base = ends[query - 1] if query else 0
                stop = max(query + 1, int(np.searchsorted(ends, base + _PROBE_CHUNK, "right")))
                found.append(_probe(values, order, first, counts, query, min(stop, n), threshold))
                query = stop
    unique = np.unique(np.concatenate(found))
    return np.stack([unique // n, unique % n], axis=1)


def _probe(
    values: np.ndarray, order: np.ndarray, first: np.ndarray, counts: np.ndarray, lo: int, hi: int, threshold: int
) -> np.ndarray:
    """Candidates of queries lo..hi compared in full; the close ones as u * n + v (u < v)."""
    n = len(values)
    counts = counts[lo:hi]
    left = np.repeat(np.arange(lo, hi, dtype=np.int64), counts)
    offsets = np.arange(len(left)) - np.repeat(np.cumsum(counts) - counts, counts)
    right = order[np.repeat(first[lo:hi], counts) + offsets]
    keep = left < right
    left, right = left[keep], right[keep]
    close = hamming(values[left], values[right]) <= threshold
    return left[close] * n + right[close]
