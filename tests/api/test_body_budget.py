"""api/body_budget.py: bytes and JSON values are counted while the body arrives (and while it inflates),
so an over-budget body is refused after reading only a little more than its budget."""

from __future__ import annotations

import asyncio
import gzip
import time
import zlib
from collections.abc import AsyncIterator

import pytest

from api.body_budget import BodyBudget, read_within
from api.errors import UnsupportedEncoding
from retrieval.errors import InvalidInput, PayloadTooLarge


class Chunks:
    """An async stream of `data` in `size`-byte chunks that remembers how many were taken."""

    def __init__(self, data: bytes, size: int = 65536) -> None:
        self.parts = [data[i : i + size] for i in range(0, len(data), size)]
        self.taken = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            self.taken += 1
            yield part


def read(chunks: Chunks, budget: BodyBudget, encoding: str | None = None) -> bytes:
    return asyncio.run(read_within(chunks, budget, encoding))


def test_a_body_within_budget_comes_back_whole_and_one_value_less_is_refused() -> None:
    body = b'{"a": [1, 2, 3], "b": {"c": "x,y"}}'
    # 4 commas (one inside a string: over-counted) + 3 containers + the document = 8
    assert read(Chunks(body, 5), BodyBudget(len(body), 8)) == body
    with pytest.raises(PayloadTooLarge, match="more than 7 JSON values"):
        read(Chunks(body, 5), BodyBudget(len(body), 7))
    with pytest.raises(PayloadTooLarge, match="larger than the limit"):
        read(Chunks(body, 5), BodyBudget(len(body) - 1, 8))


def test_json_values_are_counted_while_reading_not_after() -> None:
    rows = b"[" + b"[0]," * 1_000_000 + b"[0]]"  # 4 MB, 2 M values
    chunks = Chunks(rows)
    with pytest.raises(PayloadTooLarge, match="more than 10,000 JSON values"):
        read(chunks, BodyBudget(64 << 20, 10_000))
    assert chunks.taken == 1  # refused inside the first 64 KiB, the other 63 chunks never read


def test_many_keys_count_as_values() -> None:
    body = b"{" + b",".join(b'"k%d": 0' % i for i in range(5000)) + b"}"
    with pytest.raises(PayloadTooLarge, match="4,096 JSON values"):
        read(Chunks(body), BodyBudget(1 << 20, 4096))


def test_bytes_over_budget_are_refused_before_the_rest_is_read() -> None:
    chunks = Chunks(b" " * (1 << 20))
    with pytest.raises(PayloadTooLarge, match="larger than the limit of 100,000 bytes"):
        read(chunks, BodyBudget(100_000, 10))
    assert chunks.taken == 2


def test_only_the_json_header_is_counted_before_binary_tensor_data() -> None:
    header = b'{"inputs": [1, 2]}'
    binary = b",,,[[[{{{" * 1000  # raw bytes after the header are not JSON
    body = header + binary
    assert read(Chunks(body, 7), BodyBudget(1 << 20, 4, json_bytes=len(header))) == body
    with pytest.raises(PayloadTooLarge):
        read(Chunks(body, 7), BodyBudget(1 << 20, 4))


def test_a_gzip_bomb_is_refused_while_it_inflates() -> None:
    packer = zlib.compressobj(1, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = b"[0]," * (1 << 18)
    bomb = b"".join(packer.compress(block) for _ in range(80)) + packer.flush()  # 80 MiB of rows, ~0.4 MB
    chunks = Chunks(bomb)
    started = time.perf_counter()
    with pytest.raises(PayloadTooLarge, match="JSON values"):
        read(chunks, BodyBudget(64 << 20, 20_000), "gzip")
    refused_s = time.perf_counter() - started
    started = time.perf_counter()
    zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(bomb, 64 << 20)  # what the byte cap alone would allow
    inflate_64_mib_s = time.perf_counter() - started
    # One inflate step (1 MiB) of the first chunk was enough to see it.
    assert chunks.taken == 1 and refused_s < inflate_64_mib_s / 3, (refused_s, inflate_64_mib_s)
    zeros = gzip.compress(b" " * (65 << 20), compresslevel=1)
    with pytest.raises(PayloadTooLarge, match="larger than the limit of 67,108,864 bytes"):
        read(Chunks(zeros), BodyBudget(64 << 20, 20_000), "gzip")


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),  # zlib-wrapped, as tritonclient sends it
        ("deflate", lambda d: zlib.compress(d)[2:-4]),  # raw deflate
    ],
)
def test_compressed_bodies_inflate(encoding: str, pack: object) -> None:
    body = b'{"inputs": []}' * 10_000
    packed = pack(body)  # type: ignore[operator]
    assert read(Chunks(packed, 100), BodyBudget(1 << 20, 30_000), encoding) == body


def test_broken_compressed_bodies_and_other_encodings_are_refused() -> None:
    packed = gzip.compress(b'{"a": 1}' * 1000)
    with pytest.raises(InvalidInput, match="truncated"):
        read(Chunks(packed[: len(packed) // 2]), BodyBudget(1 << 20, 10_000), "gzip")
    with pytest.raises(InvalidInput, match="not valid gzip"):
        read(Chunks(b"not gzip at all"), BodyBudget(1 << 20, 10_000), "gzip")
    with pytest.raises(UnsupportedEncoding, match="'br'"):
        read(Chunks(b"x"), BodyBudget(1 << 20, 10_000), "br")
