"""The perceptual hash (indexer/domain/perceptual.py): the same picture re-encoded, resized or in another
format stays within the threshold, different pictures do not, and the multi-index search finds exactly
the pairs a comparison of all pairs finds, also when thousands of hashes are equal."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
from PIL import Image

from demo.duplicate_threshold import EDITS, encoded, photo_like
from indexer.domain.perceptual import HAMMING_THRESHOLD, hamming, near_pairs, phash_of_bytes, phash_of_image


def bits(a: int, b: int) -> int:
    return bin((a ^ b) & (2**64 - 1)).count("1")


@pytest.fixture(scope="module")
def pictures() -> list[Image.Image]:
    return [photo_like(seed) for seed in range(12)]


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edited_picture_stays_within_the_threshold(pictures: list[Image.Image], edit: str) -> None:
    for picture in pictures:
        original = phash_of_bytes(encoded(picture, quality=95))
        changed = phash_of_bytes(EDITS[edit](picture))
        assert original is not None and changed is not None
        assert bits(original, changed) <= HAMMING_THRESHOLD, edit


def test_different_pictures_and_a_large_crop_are_far_apart(pictures: list[Image.Image]) -> None:
    hashes = [phash_of_bytes(encoded(p, quality=95)) for p in pictures]
    assert min(bits(a, b) for a, b in itertools.combinations(hashes, 2)) > 2 * HAMMING_THRESHOLD  # type: ignore[arg-type]
    for picture, original in zip(pictures, hashes, strict=True):
        w, h = picture.size
        cropped = phash_of_bytes(encoded(picture.crop((w // 5, h // 5, w - w // 5, h - h // 5)), quality=90))
        assert bits(original, cropped) > HAMMING_THRESHOLD  # type: ignore[arg-type]


def test_exif_orientation_is_applied_before_hashing(pictures: list[Image.Image]) -> None:
    picture = pictures[0]
    upright = phash_of_bytes(encoded(picture, quality=95))
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display": the stored pixels are turned the other way
    stored = picture.transpose(Image.Transpose.ROTATE_90)
    rotated = phash_of_bytes(encoded(stored, quality=95, exif=exif.tobytes()))
    assert upright is not None and rotated is not None and bits(upright, rotated) <= HAMMING_THRESHOLD


def test_a_hash_is_a_signed_64_bit_integer_and_odd_images_hash_or_say_none() -> None:
    value = phash_of_image(Image.new("RGB", (5, 3), (200, 10, 10)))
    assert -(2**63) <= value < 2**63
    for mode in ("1", "L", "P", "RGBA", "I;16", "CMYK"):
        assert phash_of_bytes(encoded(Image.new(mode, (40, 30)), "TIFF")) is not None, mode
    assert phash_of_bytes(b"not an image") is None
    truncated = encoded(photo_like(1), quality=90)[:2000]
    assert phash_of_bytes(truncated) is None or isinstance(phash_of_bytes(truncated), int)  # never raises
    assert phash_of_bytes(b"") is None


def test_hamming_counts_bits_of_64_bit_values() -> None:
    a = np.array([0, -1, 2**62, -(2**63)], dtype=np.int64)
    b = np.array([-1, -1, 0, 0], dtype=np.int64)
    assert hamming(a, b).tolist() == [64, 0, 1, 1]


def _brute(hashes: np.ndarray, threshold: int) -> set[tuple[int, int]]:
    return {
        (i, j)
        for i, j in itertools.combinations(range(len(hashes)), 2)
        if bits(int(hashes[i]), int(hashes[j])) <= threshold
    }


def _planted(n: int, seed: int) -> np.ndarray:
    """Random hashes, a third of them copies of others with 0 to 9 bits flipped, and a run of equal ones."""
    rng = np.random.default_rng(seed)
    hashes = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    for i in range(n // 3):
        flipped = int(hashes[i]) & (2**64 - 1)  # as unsigned, so that bit 63 flips like the others
        for bit in rng.choice(64, int(rng.integers(0, 10)), replace=False):
            flipped ^= 1 << int(bit)
        hashes[n - 1 - i] = np.int64(flipped - 2**64 if flipped >= 2**63 else flipped)
    hashes[5:15] = hashes[4]
    return hashes


@pytest.mark.parametrize("threshold", [0, 3, HAMMING_THRESHOLD, 7])
def test_near_pairs_finds_exactly_the_pairs_all_pairs_would(threshold: int) -> None:
    hashes = _planted(600, threshold)
    pairs, distances = near_pairs(hashes, threshold, bundle_cap=1000)
    assert {tuple(map(int, p)) for p in pairs} == _brute(hashes, threshold)
    assert len(pairs) == len({tuple(map(int, p)) for p in pairs})  # each pair once
    assert (pairs[:, 0] < pairs[:, 1]).all()
    assert distances.tolist() == [bits(int(hashes[i]), int(hashes[j])) for i, j in pairs]


def test_thousands_of_equal_hashes_cost_pairs_in_runs_not_all_pairs() -> None:
    hashes = np.full(5000, 12345, dtype=np.int64)
    hashes[-1] = 12345 ^ 1  # one near hash: it pairs with the first `bundle_cap` of the run only
    pairs, distances = near_pairs(hashes, HAMMING_THRESHOLD, bundle_cap=10)
    runs = (4999 // 10) * 45 + (9 * 8 // 2)  # runs of 10 → 45 pairs each; the last run holds 9
    assert len(pairs) == runs + 10
    assert set(distances.tolist()) == {0, 1}
    every = np.concatenate([pairs[:, 0], pairs[:, 1]])
    assert set(every.tolist()) == set(range(5000))  # nobody is left out


def test_near_pairs_refuses_a_threshold_it_cannot_answer_exactly() -> None:
    with pytest.raises(ValueError):
        near_pairs(np.zeros(3, dtype=np.int64), 8)
    assert len(near_pairs(np.zeros(1, dtype=np.int64))[0]) == 0
    assert len(near_pairs(np.zeros(0, dtype=np.int64))[0]) == 0


def test_a_png_of_a_jpeg_hashes_alike(pictures: list[Image.Image]) -> None:
    jpeg = encoded(pictures[3], quality=80)
    png = encoded(Image.open(io.BytesIO(jpeg)), "PNG")
    a, b = phash_of_bytes(jpeg), phash_of_bytes(png)
    assert a is not None and b is not None and bits(a, b) <= 2
