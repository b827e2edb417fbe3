"""The query cache: counters, LRU order, size 0, duplicate rows, keys by token ids, read-only copies;
the local encoder answering a repeated text without a batch; and never another model's vectors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from api.config import Settings
from retrieval.encoder import LocalEncoder
from retrieval.query_cache import QueryCache, TokenKey, embed_with_cache, token_keys
from retrieval.tokenizer import tokenize
from retrieval.toolchain.toy_model import write_toy_model

DIM = 4


class Model:
    """A stand-in for the encoder's compute: a vector per row from its ids; records the rows it got."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset
        self.calls: list[np.ndarray] = []

    async def __call__(self, ids: np.ndarray) -> np.ndarray:
        self.calls.append(ids.copy())
        return np.stack([np.full(DIM, float(row.sum()) + self.offset, dtype=np.float32) for row in ids])


def embed(cache: QueryCache[TokenKey], model: Model, texts: list[str], model_id: str = "m") -> np.ndarray:
    return asyncio.run(embed_with_cache(cache, model_id, "text", tokenize(texts), model))


def test_hits_and_misses_are_counted_per_row() -> None:
    cache: QueryCache[TokenKey] = QueryCache(8)
    model = Model()
    first = embed(cache, model, ["猫", "狗"])
    assert (cache.hits, cache.misses, len(model.calls)) == (0, 2, 1)
    second = embed(cache, model, ["狗", "猫", "汽车"])
    assert (cache.hits, cache.misses, len(cache)) == (2, 3, 3)
    assert len(model.calls[-1]) == 1  # only 汽车 reached the model
    np.testing.assert_array_equal(second[:2], first[::-1])


def test_the_least_recently_used_entry_is_evicted() -> None:
    cache: QueryCache[str] = QueryCache(2)
    cache.store(["a", "b"], np.eye(2, dtype=np.float32))
    cache.lookup(["a"])  # a is now more recent than b
    cache.store(["c"], np.ones((1, 2), dtype=np.float32))
    found, missing = cache.lookup(["a", "b", "c"])
    assert sorted(found) == ["a", "c"] and missing == ["b"]


def test_size_zero_disables_the_cache() -> None:
    cache: QueryCache[TokenKey] = QueryCache(0)
    model = Model()
    for _ in range(2):
        embed(cache, model, ["猫", "猫"])
    assert [len(rows) for rows in model.calls] == [2, 2]  # every row, every time: no lookups at all
    assert (cache.hits, cache.misses, len(cache)) == (0, 0, 0)


def test_a_row_repeated_in_one_request_is_computed_once() -> None:
    cache: QueryCache[TokenKey] = QueryCache(8)
    model = Model()
    vectors = embed(cache, model, ["猫", "狗", "猫", "猫"])
    [rows] = model.calls
    np.testing.assert_array_equal(rows, tokenize(["猫", "狗"]))
    np.testing.assert_array_equal(vectors[[0, 2, 3]], np.repeat(vectors[:1], 3, axis=0))
    assert not np.array_equal(vectors[0], vectors[1])
    assert (cache.hits, cache.misses) == (2, 2)


def test_texts_with_the_same_token_ids_share_an_entry_and_others_do_not() -> None:
    cache: QueryCache[TokenKey] = QueryCache(8)
    model = Model()
    embed(cache, model, ["猫", "CAT"])
    embed(cache, model, ["猫 ", "\u3000猫", "cat"])  # the tokenizer strips spaces and lowercases
    assert (len(model.calls), cache.hits) == (1, 3)
    embed(cache, model, ["猫猫", "狗"])
    assert (len(model.calls), len(model.calls[-1]), len(cache)) == (2, 2, 4)


def test_only_trailing_padding_is_dropped_from_the_key() -> None:
    ids = np.array([[101, 7, 0, 9, 102, 0, 0], [101, 7, 9, 102, 0, 0, 0], [101, 7, 0, 9, 102, 0, 0]])
    keys = token_keys("m", "text", ids)
    assert keys[0] == keys[2] != keys[1]
    assert keys[0][2] == np.array([101, 7, 0, 9, 102], dtype=np.int64).tobytes()


def test_the_model_id_and_tower_are_part_of_the_key() -> None:
    cache: QueryCache[TokenKey] = QueryCache(8)
    model_a, model_b = Model(offset=0.0), Model(offset=1.0)
    a = embed(cache, model_a, ["猫"], model_id="a@1")
    b = embed(cache, model_b, ["猫"], model_id="a@2")
    assert len(model_b.calls) == 1 and not np.array_equal(a, b)
    assert token_keys("a@1", "text", tokenize(["猫"])) != token_keys("a@1", "image", tokenize(["猫"]))


def test_a_caller_that_modifies_a_result_cannot_change_the_cache() -> None:
    cache: QueryCache[TokenKey] = QueryCache(8)
    model = Model()
    first = embed(cache, model, ["猫"])
    expected = first.copy()
    first[:] = -1.0
    np.testing.assert_array_equal(embed(cache, model, ["猫"]), expected)
    found, _ = cache.lookup(token_keys("m", "text", tokenize(["猫"])))
    [stored] = found.values()
    with pytest.raises(ValueError, match="read-only"):
        stored[0] = 0.0


# --- the local encoder on the toy model -------------------------------------------------------------


class TextBatches:
    """An EncoderObserver that counts the text rows the model ran."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def batch_done(self, tower: str, bucket: int, items: int, timings: dict[str, float]) -> None:
        if tower == "text":
            self.rows.append(items)


def small(settings: Settings, **update: object) -> Settings:
    return settings.model_copy(update={"buckets": [1, 4, 8], "threads_per_stream": 1, **update})


def test_the_local_encoder_answers_a_repeated_query_without_a_batch(settings: Settings) -> None:
    batches = TextBatches()

    async def main() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        encoder = LocalEncoder(small(settings), observer=batches)
        await encoder.start()
        try:
            first = await encoder.embed_texts(["一张猫的照片"])
            assert batches.rows == [1]
            again = await encoder.embed_texts(["一张猫的照片"])
            by_ids = await encoder.embed_token_ids(tokenize(["一张猫的照片"]))  # the raw-ids entry shares it
            assert batches.rows == [1]
            mixed = await encoder.embed_texts(["海边的日落", "一张猫的照片"])
            assert batches.rows == [1, 1]  # only the new text ran
            return first, again, by_ids, mixed
        finally:
            await encoder.close()

    first, again, by_ids, mixed = asyncio.run(main())
    np.testing.assert_array_equal(again, first)  # bit-identical
    np.testing.assert_array_equal(by_ids, first)
    np.testing.assert_array_equal(mixed[1], first[0])


def test_a_shared_cache_never_answers_for_another_model(settings: Settings, tmp_path: Path) -> None:
    other_dir = tmp_path / "other-toy"
    write_toy_model(other_dir, buckets=(1, 4, 8), seed=1, int8=False)
    batches = TextBatches()
    text = ["一张猫的照片"]

    async def main() -> tuple[str, str, np.ndarray, np.ndarray, np.ndarray, int]:
        first = LocalEncoder(small(settings), observer=batches)
        other = LocalEncoder(small(settings, model_dir=other_dir, precision="fp32"), observer=batches)
        fresh_cache_size = len(other.query_cache)
        other.query_cache = first.query_cache  # shared on purpose: the model id must keep them apart
        reference = LocalEncoder(small(settings, model_dir=other_dir, precision="fp32", query_cache_size=0))
        for encoder in (first, other, reference):
            await encoder.start()
        try:
            a = await first.embed_texts(text)
            b = await other.embed_texts(text)
            return first.model_id, other.model_id, a, b, await reference.embed_texts(text), fresh_cache_size
        finally:
            for encoder in (first, other, reference):
                await encoder.close()

    first_id, other_id, a, b, other_reference, fresh_cache_size = asyncio.run(main())
    assert first_id != other_id
    assert fresh_cache_size == 0  # an encoder for a new model directory starts empty
    assert batches.rows == [1, 1]  # the second model ran its own batch: no hit on the first's entry
    np.testing.assert_allclose(b, other_reference, atol=1e-6)
    assert not np.allclose(a, b, atol=1e-3)
