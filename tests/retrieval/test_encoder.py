"""LocalEncoder on the toy model: start-up, precision, padding, streams, the raw-tensor entry points,
bad input, and agreement with a plain ONNX Runtime session."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

import retrieval
from api.config import Settings
from retrieval.encoder import LocalEncoder, create_encoder
from retrieval.errors import EncoderUnavailable, InvalidImage, InvalidInput, ModelError
from retrieval.manifest import ModelManifest
from retrieval.types import Encoder

TEXTS = ["一张猫的照片", "穿红色裙子的女孩", "a red car", "海边的日落", "北京"]


def png(color: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    buffer = io.BytesIO()
    rng = np.random.default_rng(sum(color))
    pixels = np.clip(np.array(color) + rng.integers(-30, 30, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


IMAGES = [png((250, 10, 10)), png((10, 250, 10)), png((10, 10, 250)), png((128, 128, 128), (300, 20))]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Fewer buckets: start-up (which warms every bucket) stays fast on a busy 2-core machine. No
    query cache: these tests compare the model's own answers (a repeated text would be a lookup);
    tests/api/test_query_cache.py tests the cache."""
    return settings.model_copy(update={"buckets": [1, 4, 8], "query_cache_size": 0})


def run(settings: Settings, scenario, **kwargs):
    async def main():
        encoder = LocalEncoder(settings, **kwargs)
        await encoder.start()
        try:
            return await scenario(encoder)
        finally:
            await encoder.close()

    return asyncio.run(main())


def reference_vectors(model_dir: Path, tower: str, precision: str, inputs: np.ndarray) -> np.ndarray:
    """One row at a time through the bucket-1 graph, with a plain InferenceSession."""
    manifest = ModelManifest.load(model_dir)
    spec = manifest.towers[tower]
    session = ort.InferenceSession(str(manifest.graph_path(tower, precision, 1)), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run([spec.output_name], {spec.input_name: row[None]})[0] for row in inputs])


def test_start_chooses_cpu_int8_and_is_ready_only_after(settings: Settings) -> None:
    async def main():
        encoder = LocalEncoder(settings.model_copy(update={"buckets": [1, 4, 8, 16, 32]}))
        assert not encoder.ready
        with pytest.raises(EncoderUnavailable, match="not started"):
            await encoder.embed_texts(["猫"])
        await encoder.start()
        state = (encoder.ready, encoder.provider.name, dict(encoder.precision), dict(encoder.buckets))
        await encoder.close()
        return state, encoder.ready

    (ready, provider, precision, buckets), after_close = asyncio.run(main())
    assert ready and provider == "cpu" and not after_close
    assert precision == {"image": "int8", "text": "int8"}
    assert buckets["text"] == [1, 4, 8, 16, 32]


def test_attributes_and_protocol(settings: Settings) -> None:
    encoder = create_encoder(settings)
    assert isinstance(encoder, LocalEncoder) and isinstance(encoder, Encoder)
    assert (encoder.model_id, encoder.dim, encoder.logit_scale) == (encoder.manifest.model_id, 32, 100.0)
    assert encoder.model_id.startswith("toy@")  # the name plus a fingerprint of the files
    assert (encoder.image_size, encoder.context_length) == (224, 52)
    assert encoder.manifest.arch == "toy"


def test_texts_match_plain_onnxruntime(settings: Settings, toy_model_dir: Path) -> None:
    settings = settings.model_copy(update={"precision": "fp32"})
    ours = run(settings, lambda e: e.embed_texts(TEXTS))
    reference = reference_vectors(toy_model_dir, "text", "fp32", retrieval.tokenize(TEXTS))
    assert ours.dtype == np.float32 and ours.shape == (5, 32)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)
    assert np.abs(ours - reference).max() < 1e-5


def test_images_match_plain_onnxruntime(settings: Settings, toy_model_dir: Path) -> None:
    settings = settings.model_copy(update={"precision": "fp32"})
    ours = run(settings, lambda e: e.embed_images(IMAGES))
    pixels = np.stack([retrieval.preprocess_image(data) for data in IMAGES])
    reference = reference_vectors(toy_model_dir, "image", "fp32", pixels)
    assert ours.shape == (4, 32) and np.abs(ours - reference).max() < 1e-5


def test_int8_is_close_to_fp32_but_not_identical(settings: Settings) -> None:
    fp32 = run(settings.model_copy(update={"precision": "fp32"}), lambda e: e.embed_texts(TEXTS))
    int8 = run(settings, lambda e: e.embed_texts(TEXTS))
    cosines = (fp32 * int8).sum(axis=1)
    assert cosines.min() > 0.99 and np.abs(fp32 - int8).max() > 0


def test_padding_never_leaks(settings: Settings) -> None:
    async def scenario(encoder: LocalEncoder):
        together = await encoder.embed_texts(TEXTS[:3])  # one batch of 3 padded to bucket 4
        singles = [await encoder.embed_texts([t]) for t in TEXTS[:3]]
        merged = await asyncio.gather(*(encoder.embed_texts([t]) for t in TEXTS[:3]))
        images_together = await encoder.embed_images(IMAGES[:3])
        image_singles = [await encoder.embed_images([i]) for i in IMAGES[:3]]
        return together, np.concatenate(singles), np.concatenate(merged), images_together, image_singles

    together, singles, merged, images_together, image_singles = run(settings, scenario)
    assert np.abs(together - singles).max() < 1e-6
    assert np.abs(merged - singles).max() < 1e-6
    assert np.abs(images_together - np.concatenate(image_singles)).max() < 1e-6


def test_raw_tensor_entry_points_use_the_same_model(settings: Settings) -> None:
    async def scenario(encoder: LocalEncoder):
        by_text = await encoder.embed_texts(TEXTS)
        by_ids = await encoder.embed_token_ids(retrieval.tokenize(TEXTS))
        by_bytes = await encoder.embed_images(IMAGES)
        by_pixels = await encoder.embed_pixels(np.stack([retrieval.preprocess_image(d) for d in IMAGES]))
        return by_text, by_ids, by_bytes, by_pixels

    by_text, by_ids, by_bytes, by_pixels = run(settings, scenario)
    assert np.array_equal(by_text, by_ids) and np.array_equal(by_bytes, by_pixels)


def test_bad_inputs_are_project_errors(settings: Settings) -> None:
    async def scenario(encoder: LocalEncoder):
        errors = []
        for call in (
            lambda: encoder.embed_images([IMAGES[0], b"not an image", IMAGES[1]]),
            lambda: encoder.embed_images([b""]),
            lambda: encoder.embed_texts("a single string"),
            lambda: encoder.embed_token_ids(np.zeros((2, 10), np.int64)),
            lambda: encoder.embed_token_ids(np.full((1, 52), 10**6, np.int64)),
            lambda: encoder.embed_pixels(np.zeros((1, 3, 32, 32), np.float32)),
            lambda: encoder.embed_pixels(np.full((1, 3, 224, 224), np.nan, np.float32)),
        ):
            try:
                await call()
            except (InvalidImage, InvalidInput) as exc:
                errors.append(exc)
        ok = await encoder.embed_texts(["still serving"])
        empty = await encoder.embed_texts([])
        return errors, ok, empty

    errors, ok, empty = run(settings, scenario)
    assert len(errors) == 7
    assert isinstance(errors[0], InvalidImage) and errors[0].message.startswith("image 1:")
    assert isinstance(errors[1], InvalidImage) and "empty" in errors[1].message
    assert ok.shape == (1, 32) and empty.shape == (0, 32)


def test_image_limits_come_from_settings(settings: Settings) -> None:
    settings = settings.model_copy(update={"max_image_bytes": 100})

    async def scenario(encoder: LocalEncoder):
        with pytest.raises(InvalidImage, match="limit is 100 bytes"):
            await encoder.embed_images([IMAGES[0]])

    run(settings, scenario)


def test_two_streams_give_the_same_vectors(settings: Settings) -> None:
    one = run(settings, lambda e: e.embed_texts(TEXTS))

    async def scenario(encoder: LocalEncoder):
        many = await asyncio.gather(*(encoder.embed_texts([t]) for t in TEXTS * 8))
        return np.concatenate(many), [len(p.streams) for p in encoder._pools.values()]

    many, streams = run(settings.model_copy(update={"streams": 2, "pin_threads": True}), scenario)
    assert streams == [2, 2]
    assert np.abs(many - np.concatenate([one] * 8)).max() < 1e-6


def test_observer_and_queue_depth(settings: Settings) -> None:
    calls = []

    class Observer:
        def batch_done(self, tower: str, bucket: int, items: int, timings: dict[str, float]) -> None:
            calls.append((tower, bucket, items, sorted(timings)))

    async def scenario(encoder: LocalEncoder):
        await encoder.embed_texts(TEXTS[:3])
        await encoder.embed_images(IMAGES[:1])
        return encoder.queue_depth("text"), encoder.queue_depth("image")

    depths = run(settings, scenario, observer=Observer())
    assert depths == (0, 0)
    assert [c[0] for c in calls] == ["text", "image"]
    # One shape-dynamic session per stream (CNCLIP_DYNAMIC_SHAPES): 3 rows run as 3, not padded to bucket 4.
    assert calls[0][1:3] == (3, 3) and calls[0][3] == ["inference", "post", "preprocess", "queue"]


def test_bucket_settings_are_checked(settings: Settings) -> None:
    only_small = run(settings.model_copy(update={"buckets": [1, 4, 64]}), lambda e: asyncio.sleep(0, e.buckets))
    assert only_small == {"image": [1, 4], "text": [1, 4]}
    with pytest.raises(ModelError, match="none of the configured buckets"):
        run(settings.model_copy(update={"buckets": [3]}), lambda e: asyncio.sleep(0))
    with pytest.raises(ModelError, match="only has fp32, int8"):
        run(settings.model_copy(update={"precision": "fp16"}), lambda e: asyncio.sleep(0))


def test_large_request_beyond_the_queue_is_chunked(settings: Settings) -> None:
    settings = settings.model_copy(update={"max_queue_size": 16})
    texts = [f"文本 {i}" for i in range(70)]

    async def scenario(encoder: LocalEncoder):
        return await encoder.embed_texts(texts), await encoder.embed_texts(texts[:1])

    many, first = run(settings, scenario)
    assert many.shape == (70, 32) and np.abs(many[0] - first[0]).max() < 1e-6


def test_bench_encoders_command_on_the_toy_model(toy_model_dir: Path, tmp_path: Path) -> None:
    """Smoke run of `cnclip bench encoders`: every point measured, with sane numbers."""
    import json

    import typer
    from typer.testing import CliRunner

    from cli.bench import register

    app = typer.Typer()
    register(app)

    out = tmp_path / "points.json"
    result = CliRunner().invoke(
        app,
        ["bench", "encoders", "--model", str(toy_model_dir), "--concurrency", "1,4", "--duration", "0.3",
         "--configs", "1:on,1:off", "--buckets", "1,4", "--json", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    points = json.loads(out.read_text())
    assert len(points) == 2 * 2 * 2  # towers × concurrencies × configs
    assert all(p["items"] > 0 and 0 < p["p50_ms"] <= p["p95_ms"] <= p["p99_ms"] for p in points)
    assert "| text | 1 | on | 4 |" in result.output


def test_benchmark_script_smoke_run_on_the_toy_model(toy_model_dir: Path, tmp_path: Path) -> None:
    """benchmarks/bench_encoders.py end to end, tiny: every section of the report is there."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_encoders.py"
    spec = importlib.util.spec_from_file_location("bench_encoders", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "report.md"
    report = module.main(
        ["--model", str(toy_model_dir), "--repeats", "1", "--duration", "0.2", "--baseline-seconds", "0.2",
         "--concurrency", "2", "--configs", "1:on,2:off", "--buckets", "1,4", "--tokenizer-queries", "500", "--isolate",
         "--peak-shape", "64,64,64", "--peak-seconds", "0.01", "--out", str(out)]
    )  # fmt: skip
    assert out.read_text() == report
    assert "| ours, cold caches |" in report and "| cn_clip FullTokenizer |" in report
    assert "| ORT fp32, batch 1, no batcher |" in report
    assert "| int8 | " in report and "| fp32 | " in report  # the GEMM peak table
    assert "× baseline | % of peak |" in report
    assert re.search(r"^\| text \| 1 \| on \| 2 \| .* \| \d+\.\d % \|$", report, re.MULTILINE), report
    assert "| image | 2 | off | 2 |" in report


def test_a_bucket_that_cannot_run_fails_start_up(settings: Settings) -> None:
    from retrieval.sessions import OrtSession

    def factory(path, config, input_name, output_name):
        session = OrtSession(path, config, input_name, output_name)
        if ".b4." in path.name:
            session.output_name = "no_such_output"  # ONNX Runtime refuses to run it
        return session

    async def main():
        encoder = LocalEncoder(settings, session_factory=factory)
        with pytest.raises(ModelError, match="bucket 4 failed its warm-up run"):
            await encoder.start()
        return encoder.ready

    assert asyncio.run(main()) is False
