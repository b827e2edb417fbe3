"""Text length buckets: choosing the length, the manifest (format 2, format 1 still read), the
encoder running each text in the shortest graph that holds it, and batches of mixed lengths."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from api.config import Settings
from retrieval.backends.base import SessionConfig
from retrieval.batcher import assemble
from retrieval.encoder import LocalEncoder
from retrieval.errors import ModelError
from retrieval.manifest import ModelManifest
from retrieval.sessions import OrtSession
from retrieval.text_lengths import parse_lengths, shortest_length, split_by_length, used_lengths
from retrieval.tokenizer import tokenize
from retrieval.toolchain.toy_model import write_toy_model

SHORT = "猫"  # [CLS] 猫 [SEP]: 3 tokens
QUERY = "穿红色裙子的女孩"  # 10 tokens
CAPTION = "一张清晰的穿红色裙子的女孩在公园里放风筝的照片"  # 25 tokens
LONG = "雨后的城市街道倒映着霓虹灯" * 4  # cut to 52


@pytest.fixture(scope="module")
def toy_lengths(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("toy-lengths")
    write_toy_model(directory, buckets=(1, 4), text_lengths=(16, 32))
    return directory


# --- choosing a length -----------------------------------------------------------------------------


def test_used_length_is_the_last_non_padding_position_plus_one() -> None:
    ids = tokenize([SHORT, QUERY, CAPTION, LONG])
    assert used_lengths(ids).tolist() == [3, 10, 25, 52]
    # A padding id inside a row does not end it (ids sent as tensors may have any layout).
    assert used_lengths(np.array([[101, 0, 7, 102, 0, 0], [0, 0, 0, 0, 0, 0]])).tolist() == [4, 0]


def test_shortest_length_that_holds_the_tokens() -> None:
    lengths = [16, 32, 52]
    assert [shortest_length(n, lengths) for n in (0, 3, 16, 17, 32, 33, 52)] == [16, 16, 16, 32, 32, 52, 52]
    with pytest.raises(ModelError, match="do not fit"):
        shortest_length(53, lengths)


def test_split_groups_rows_by_length_and_cuts_only_padding() -> None:
    ids = tokenize([CAPTION, SHORT, LONG, QUERY])
    groups = split_by_length(ids, [16, 32, 52])
    assert [(rows.tolist(), part.shape) for rows, part in groups] == [
        ([1, 3], (2, 16)),
        ([0], (1, 32)),
        ([2], (1, 52)),
    ]
    for rows, part in groups:
        width = part.shape[1]
        assert np.array_equal(part, ids[rows, :width]) and not ids[rows, width:].any()


def test_lengths_are_checked_and_always_include_the_full_one() -> None:
    assert parse_lengths([32, 16, 16], 52) == [16, 32, 52]
    for bad in ([1], [53], [0, 16]):
        with pytest.raises(ModelError, match="between 2 and the context length 52"):
            parse_lengths(bad, 52)


# --- the manifest ----------------------------------------------------------------------------------


def test_manifest_format_2_records_the_length_graphs(toy_lengths: Path) -> None:
    raw = json.loads((toy_lengths / "manifest.json").read_text())
    assert raw["format"] == 2
    assert raw["towers"]["text"]["lengths"]["int8"]["16"] == {
        "1": "text.int8.b1.l16.onnx",
        "4": "text.int8.b4.l16.onnx",
    }
    manifest = ModelManifest.load(toy_lengths)  # every graph hashed and verified
    assert manifest.text_lengths("fp32") == manifest.text_lengths("int8") == [16, 32, 52]
    assert manifest.graph_path("text", "int8", 4, 32).name == "text.int8.b4.l32.onnx"
    assert manifest.graph_path("text", "int8", 4, 52) == manifest.graph_path("text", "int8", 4)
    with pytest.raises(ModelError, match="no text/int8 graph for batch 4 at length 24"):
        manifest.graph_path("text", "int8", 4, 24)


def test_format_1_manifests_still_load(tmp_path: Path) -> None:
    write_toy_model(tmp_path, buckets=(1,))
    raw = json.loads((tmp_path / "manifest.json").read_text())
    assert raw["format"] == 1 and "lengths" not in raw["towers"]["text"]  # no length buckets: still format 1
    assert ModelManifest.load(tmp_path).text_lengths("fp32") == [52]
    shipped = Path(__file__).resolve().parents[2] / "models" / "cnclip-demo"
    assert json.loads((shipped / "manifest.json").read_text())["format"] == 1
    assert ModelManifest.load(shipped, verify=False).text_lengths("fp32") == [52]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t["text"]["lengths"]["int8"].update({"52": {"1": "x.onnx"}}), r"length 52 must lie in \[2, con"),
        (lambda t: t["text"]["lengths"].update({"fp16": {"16": {"1": "x.onnx"}}}), "precision 'fp16', which has no"),
        (lambda t: t["image"].update({"lengths": {"fp32": {"16": {"1": "x.onnx"}}}}), "only the text tower"),
        (lambda t: t["text"]["lengths"]["int8"].update({"abc": {}}), "lengths must be integers"),
    ],
)
def test_bad_length_entries_are_refused(toy_lengths: Path, tmp_path: Path, edit, message: str) -> None:
    raw = json.loads((toy_lengths / "manifest.json").read_text())
    edit(raw["towers"])
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ModelError, match=message):
        ModelManifest.load(tmp_path, verify=False)


def test_unknown_format_is_refused(toy_lengths: Path, tmp_path: Path) -> None:
    raw = json.loads((toy_lengths / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**raw, "format": 3}))
    with pytest.raises(ModelError, match="format 3 .*reads formats 1 and 2"):
        ModelManifest.load(tmp_path, verify=False)


# --- the encoder -----------------------------------------------------------------------------------


class RecordingSession(OrtSession):
    """A real ONNX Runtime session that records the shape of every batch it runs."""

    shapes: list[tuple[int, int]] = []

    def run(self, batch: np.ndarray) -> np.ndarray:
        if batch.ndim == 2:
            RecordingSession.shapes.append(batch.shape)
        return super().run(batch)


def encode(settings: Settings, texts_per_call: list[list[str]], **update) -> tuple[list[np.ndarray], LocalEncoder]:
    async def main() -> tuple[list[np.ndarray], LocalEncoder]:
        encoder = LocalEncoder(settings.model_copy(update=update), session_factory=RecordingSession)
        await encoder.start()
        try:
            RecordingSession.shapes.clear()
            return [await encoder.embed_texts(texts) for texts in texts_per_call], encoder
        finally:
            await encoder.close()

    return asyncio.run(main())


def test_each_text_runs_in_the_shortest_graph_and_gets_the_full_graphs_vector(
    settings: Settings, toy_lengths: Path
) -> None:
    # A session per bucket graph (CNCLIP_DYNAMIC_SHAPES=false); the one shape-dynamic session runs
    # each text at its own length (tests/retrieval/test_tight_text.py).
    base = {"model_dir": toy_lengths, "buckets": [1, 4], "precision": "fp32", "dynamic_shapes": False}
    texts = [SHORT, QUERY, CAPTION, LONG]
    bucketed, encoder = encode(settings, [[t] for t in texts], **base)
    assert encoder.text_lengths == [16, 32, 52] and not encoder.tight_text
    assert RecordingSession.shapes == [(1, 16), (1, 16), (1, 32), (1, 52)]
    full, encoder = encode(settings, [[t] for t in texts], **base, text_lengths=[52])
    assert encoder.text_lengths == [52] and RecordingSession.shapes == [(1, 52)] * 4
    for a, b in zip(bucketed, full, strict=True):
        assert float((a * b).sum()) >= 0.99999


def test_a_mixed_request_is_split_by_length_and_comes_back_in_order(settings: Settings, toy_lengths: Path) -> None:
    base = {"model_dir": toy_lengths, "buckets": [1, 4], "precision": "fp32"}
    texts = [LONG, SHORT, CAPTION, QUERY, SHORT]
    (mixed,), _ = encode(settings, [texts], **base)
    singles, _ = encode(settings, [[t] for t in texts], **base, text_lengths=[52])
    assert np.allclose(mixed, np.concatenate(singles), atol=1e-6)


def test_every_batch_and_length_pair_is_warmed_and_logged(
    settings: Settings, toy_lengths: Path, caplog: pytest.LogCaptureFixture
) -> None:
    warmed: list[tuple[int, ...]] = []

    class Warmed(OrtSession):
        def run(self, batch: np.ndarray) -> np.ndarray:
            warmed.append(batch.shape[:2] if batch.ndim == 2 else (len(batch),))
            return super().run(batch)

    async def main() -> None:
        encoder = LocalEncoder(
            settings.model_copy(update={"model_dir": toy_lengths, "buckets": [1, 4]}), session_factory=Warmed
        )
        with caplog.at_level(logging.INFO, logger="retrieval.encoder"):
            await encoder.start()
        await encoder.close()

    asyncio.run(main())
    assert sorted({w for w in warmed if len(w) == 2}) == [(b, n) for b in (1, 4) for n in (16, 32, 52)]
    assert "text lengths [16, 32, 52], any length between them unpadded (6 text graphs warmed" in caplog.text


def test_text_lengths_setting_chooses_among_the_models_lengths(settings: Settings, toy_lengths: Path) -> None:
    base = {"model_dir": toy_lengths, "buckets": [1, 4]}
    _, encoder = encode(settings, [[QUERY, CAPTION]], **base, text_lengths=[16])
    assert encoder.text_lengths == [16, 52]
    # split, or merged at the longest; each cut to its own length on the one shape-dynamic session
    assert sorted(RecordingSession.shapes) in ([(1, 10), (1, 25)], [(2, 25)])
    _, encoder = encode(settings, [[QUERY, CAPTION]], **base, text_lengths=[16], dynamic_shapes=False)
    assert sorted(RecordingSession.shapes) in ([(1, 16), (1, 52)], [(4, 52)])  # merged: padded to bucket 4
    with pytest.raises(ModelError, match=r"CNCLIP_TEXT_LENGTHS asks for \[24\].*have lengths \[16, 32, 52\]"):
        encode(settings, [], **base, text_lengths=[24])
    with pytest.raises(ValueError, match="at least 2 tokens"):
        Settings(text_lengths=[1])


def test_token_ids_sent_as_tensors_use_the_length_buckets_too(settings: Settings, toy_lengths: Path) -> None:
    async def main() -> np.ndarray:
        encoder = LocalEncoder(
            settings.model_copy(update={"model_dir": toy_lengths, "buckets": [1, 4]}), session_factory=RecordingSession
        )
        await encoder.start()
        try:
            RecordingSession.shapes.clear()
            return await encoder.embed_token_ids(tokenize([QUERY]))
        finally:
            await encoder.close()

    asyncio.run(main())
    assert RecordingSession.shapes == [(1, 10)]  # cut as a text is: to its own 10 tokens on the one session


# --- batches of mixed lengths ------------------------------------------------------------------------


def test_a_batch_of_mixed_lengths_is_padded_to_its_longest_with_the_padding_token() -> None:
    short, long = tokenize([SHORT], 16), tokenize([CAPTION], 32)
    batch = assemble([short, long], padding_rows=2)
    assert batch.shape == (4, 32) and batch.dtype == np.int64 and batch.flags["C_CONTIGUOUS"]
    assert np.array_equal(batch[0, :16], short[0]) and not batch[0, 16:].any()
    assert np.array_equal(batch[1], long[0])
    assert np.array_equal(batch[2], batch[0]) and np.array_equal(batch[3], batch[0])  # padding copies a real row
    images = [np.zeros((1, 3, 8, 8), np.float32), np.ones((2, 3, 8, 8), np.float32)]
    assert assemble(images, padding_rows=1).shape == (4, 3, 8, 8)


def test_concurrent_queries_of_two_lengths_share_one_batch(settings: Settings, toy_lengths: Path) -> None:
    """Under load the batcher merges 16- and 32-token queries: one run at width 32, same vectors."""

    async def main() -> tuple[np.ndarray, np.ndarray]:
        encoder = LocalEncoder(
            settings.model_copy(update={"model_dir": toy_lengths, "buckets": [1, 4], "precision": "fp32"}),
            session_factory=RecordingSession,
        )
        await encoder.start()
        try:
            # Hold the only stream so that both queries queue, then release it.
            pool = encoder._pools["text"]
            stream = await pool.acquire()
            RecordingSession.shapes.clear()
            pending = asyncio.gather(
                encoder.embed_texts([QUERY]), encoder.embed_texts([CAPTION]), encoder.embed_texts([SHORT])
            )
            await asyncio.sleep(0.05)
            pool.release(stream)
            a, b, _ = await pending
            return a, b
        finally:
            await encoder.close()

    a, b = asyncio.run(main())
    assert RecordingSession.shapes == [(3, 25)]  # 3 rows at the longest row's length, unpadded (one dynamic session)
    config = SessionConfig(provider="cpu", precision="fp32")
    manifest = ModelManifest.load(toy_lengths)
    alone = OrtSession(manifest.graph_path("text", "fp32", 1, 16), config, "text", "text_features")
    assert np.allclose(
        a, alone.run(tokenize([QUERY], 16)) / np.linalg.norm(alone.run(tokenize([QUERY], 16))), atol=1e-6
    )
    assert b.shape == (1, manifest.embed_dim)


def test_npu_ge_export_writes_one_static_text_model_per_length(toy_lengths: Path, tmp_path: Path) -> None:
    from retrieval.toolchain.triton.export import ExportOptions, export_triton_repository

    report = export_triton_repository(toy_lengths, tmp_path / "repo", ExportOptions(backend="npu_ge", max_batch=4))
    assert report.models[:4] == ["cnclip_text", "cnclip_text_l16", "cnclip_text_l32", "cnclip_image"]
    config = (tmp_path / "repo" / "cnclip_text_l16" / "config.pbtxt").read_text()
    assert "max_batch_size: 0" in config and "dims: [ 4, 16 ]" in config and 'string_value: "true"' in config
