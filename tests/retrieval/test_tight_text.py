"""Texts cut to their own length on the one shape-dynamic session (retrieval/text_lengths.py, issue 34).

A stream whose one ONNX Runtime session spans several length graphs has a free length axis, so a
10-token query runs at 10 rather than padded to the 16-token bucket. These tests hold the rewritten
graph's answers at every width from a text's own length up to its bucket (below the smallest bucket
too) to its answer at the bucket, the encoder to running each text at its own length with the
bucketed vectors, and the cut to sessions that can take it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from api.config import Settings
from retrieval.backends import SessionConfig
from retrieval.backends.onnxruntime import OrtSession
from retrieval.encoder import LocalEncoder
from retrieval.manifest import ModelManifest
from retrieval.shared_weights import SharedWeights
from retrieval.text_lengths import split_by_length, used_lengths
from retrieval.tokenizer import tokenize
from retrieval.toolchain.gate import MIN_BATCH_COSINE
from retrieval.toolchain.toy_model import write_toy_model

TEXTS = ["猫", "红色的裙子", "穿红色裙子的女孩", "一只在草地上奔跑的小狗和它的主人", "雨后的城市街道倒映着霓虹灯" * 4]
# How close a text's vector at its own length stays to its vector at the bucket: fp32 is exact (the
# padding is masked); dynamic int8 takes its ranges over the padding too, so it moves as with batchmates.
FLOOR = {"fp32": 0.99999, "int8": MIN_BATCH_COSINE}


@pytest.fixture(scope="module")
def toy_lengths(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("toy-tight")
    write_toy_model(directory, buckets=(1, 4), text_lengths=(16, 32))
    return directory


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_tight_groups_are_cut_to_their_longest_row_and_never_past_their_bucket() -> None:
    ids = tokenize(["猫", "穿红色裙子的女孩", "一张清晰的穿红色裙子的女孩在公园里放风筝的照片"], 52)
    ids = np.concatenate([ids, np.zeros((1, 52), dtype=np.int64)])  # a row of padding only
    assert used_lengths(ids).tolist() == [3, 10, 25, 0]
    bucketed = split_by_length(ids, [16, 32, 52])
    assert [(rows.tolist(), group.shape) for rows, group in bucketed] == [([0, 1, 3], (3, 16)), ([2], (1, 32))]
    tight = split_by_length(ids, [16, 32, 52], tight=True)
    assert [(rows.tolist(), group.shape) for rows, group in tight] == [([0, 1, 3], (3, 10)), ([2], (1, 25))]
    assert np.array_equal(tight[0][1], bucketed[0][1][:, :10])  # only padding was cut
    ((_, lone_padding),) = split_by_length(ids[3:], [16, 52], tight=True)
    assert lone_padding.shape == (1, 2)  # [CLS] [SEP] wide at least


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_one_session_answers_at_any_width_as_at_the_bucket(toy_lengths: Path, precision: str) -> None:
    manifest = ModelManifest.load(toy_lengths)
    spec = manifest.towers["text"]
    stream = SessionConfig(
        provider="cpu", precision=precision, cores=[0], weights=SharedWeights("t"), dynamic_shapes=True
    )
    sessions = [
        OrtSession(manifest.graph_path("text", precision, b, n), stream, spec.input_name, spec.output_name)
        for b in (1, 4)
        for n in (16, 32, None)
    ]
    session = sessions[0]
    assert session.any_length_up_to() == 52
    ids = tokenize(TEXTS, 52)
    worst = 1.0
    for row, used in zip(ids, used_lengths(ids), strict=True):
        bucket = next(n for n in (16, 32, 52) if n >= used)
        at_bucket = session.run(row[None, :bucket])
        for width in range(int(used), bucket + 1):  # 3 tokens runs below the smallest graph, 16
            worst = min(worst, float(cosine(session.run(row[None, :width]), at_bucket)[0]))
    assert worst >= FLOOR[precision], worst
    # Per bucket graph (no shape-dynamic session) a text runs at its bucket's length only.
    own = SessionConfig(provider="cpu", precision=precision, cores=[0])
    static = OrtSession(manifest.graph_path("text", precision, 1, 16), own, spec.input_name, spec.output_name)
    assert static.any_length_up_to() == 0


def encode(settings: Settings, model: Path, precision: str, dynamic: bool) -> tuple[np.ndarray, np.ndarray, bool]:
    """Each text alone, then all together: (alone, together, whether the encoder cut tight)."""

    async def main() -> tuple[np.ndarray, np.ndarray, bool]:
        update = {"model_dir": model, "buckets": [1, 4], "precision": precision, "dynamic_shapes": dynamic}
        encoder = LocalEncoder(settings.model_copy(update=update))
        await encoder.start()
        try:
            alone = np.concatenate([await encoder.embed_texts([t]) for t in TEXTS])
            return alone, await encoder.embed_texts(TEXTS), encoder.tight_text
        finally:
            await encoder.close()

    return asyncio.run(main())


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_encoder_runs_texts_at_their_own_length_with_the_bucketed_vectors(
    settings: Settings, toy_lengths: Path, precision: str
) -> None:
    tight_alone, tight_together, tight = encode(settings, toy_lengths, precision, dynamic=True)
    bucketed_alone, _, bucketed = encode(settings, toy_lengths, precision, dynamic=False)
    assert tight and not bucketed
    assert cosine(tight_alone, bucketed_alone).min() >= FLOOR[precision]
    # In one request the short texts run together at their group's longest row: the same vectors.
    assert cosine(tight_together, tight_alone).min() >= FLOOR[precision]


def test_a_model_with_one_text_length_runs_at_that_length(settings: Settings, tmp_path: Path) -> None:
    write_toy_model(tmp_path, buckets=(1, 4))  # the full length only: the graph's length axis stays fixed
    _, _, tight = encode(settings, tmp_path, "fp32", dynamic=True)
    assert not tight
