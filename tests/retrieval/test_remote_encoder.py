"""TritonEncoder against our own v2 endpoint on loopback: equal vectors, and a server that is down,
slow, failing, missing a model or serving other shapes."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from api.config import Settings
from retrieval.encoder_url import parse_encoder_url
from retrieval.errors import EncoderUnavailable, InvalidImage, ModelError
from retrieval.manifest import ModelManifest
from retrieval.preprocess import preprocess_image
from retrieval.remote import TritonEncoder
from tests.support.kserve_server import ServerThread, free_port, image_file, local_encoder, v2_app


class Recorder:
    """An EncoderObserver that keeps what it is told."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, int, int, dict[str, float]]] = []

    def batch_done(self, tower: str, bucket: int, items: int, timings: dict[str, float]) -> None:
        self.batches.append((tower, bucket, items, timings))


class FlakyEncoder:
    """Wraps an encoder: the first `failures` inferences fail with 503, every inference waits `delay_s`."""

    def __init__(self, inner: Any, failures: int = 0, delay_s: float = 0.0) -> None:
        self.inner, self.failures, self.delay_s, self.calls = inner, failures, delay_s, 0
        self.batch_sizes: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _gate(self) -> None:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        if self.calls <= self.failures:
            raise EncoderUnavailable("simulated outage")

    async def embed_token_ids(self, ids: np.ndarray) -> np.ndarray:
        self.batch_sizes.append(len(ids))
        await self._gate()
        return await self.inner.embed_token_ids(ids)

    async def embed_images(self, images: list[bytes]) -> np.ndarray:
        self.batch_sizes.append(len(images))
        await self._gate()
        return await self.inner.embed_images(images)


@pytest.fixture(scope="module")
def remote_settings(toy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    data_dir = tmp_path_factory.mktemp("remote-data")
    return Settings(_env_file=None, model_dir=toy_model_dir, data_dir=data_dir, provider="cpu", buckets=[1, 4, 8])


@pytest.fixture(scope="module")
def server(remote_settings: Settings) -> Iterator[ServerThread]:
    with ServerThread(v2_app(local_encoder(remote_settings))) as running:
        yield running


def remote(settings: Settings, url: str, **kwargs: Any) -> TritonEncoder:
    return TritonEncoder(settings, url=f"triton://{url}", **{"timeout_s": 10.0, "retries": 2, **kwargs})


def test_encoder_url_forms() -> None:
    assert parse_encoder_url("triton://10.0.0.5:8000") == "10.0.0.5:8000"
    assert parse_encoder_url("http://triton.internal") == "triton.internal:8000"
    assert parse_encoder_url("triton://[::1]:9000") == "[::1]:9000"
    with pytest.raises(ModelError, match="triton://host:port"):
        parse_encoder_url("grpc://host:8001")


def test_vectors_equal_the_local_encoder(server: ServerThread, remote_settings: Settings) -> None:
    # 80 distinct texts (the query cache would send a repeated one once): split into two requests.
    texts = [f"{text}{i}" for i in range(20) for text in ["穿红色裙子的女孩", "一只猫", "汽车", "a dog on the grass"]]
    files = [image_file((200, 10, 10)), image_file((10, 10, 200), fmt="JPEG"), image_file((90, 90, 90))]
    local = server.app.state.encoder
    expected_text = server.call(local.embed_texts(texts))
    expected_image = server.call(local.embed_images(files))
    recorder = Recorder()

    async def scenario() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        encoder = remote(remote_settings, server.url, observer=recorder)
        await encoder.start()
        try:
            # The same id as the local encoder: collections embedded by either are searchable by both.
            assert encoder.ready and encoder.dim == 32 and encoder.model_id == local.model_id
            assert encoder.model_id.startswith("toy@")
            pixels = np.stack([preprocess_image(f) for f in files])
            return (
                await encoder.embed_texts(texts),
                await encoder.embed_images(files),
                await encoder.embed_pixels(pixels),
            )
        finally:
            await encoder.close()
            assert not encoder.ready

    text, image, from_pixels = asyncio.run(scenario())
    assert text.shape == (80, 32) and text.dtype == np.float32
    np.testing.assert_allclose(text, expected_text, atol=1e-6)
    np.testing.assert_allclose(image, expected_image, atol=1e-6)
    np.testing.assert_allclose(from_pixels, expected_image, atol=1e-5)
    assert sorted((tower, items) for tower, _, items, _ in recorder.batches) == [
        ("image", 3),
        ("image", 3),
        ("text", 16),
        ("text", 64),
    ]


def test_a_repeated_text_is_not_sent_again(server: ServerThread, remote_settings: Settings) -> None:
    recorder = Recorder()

    async def scenario() -> tuple[np.ndarray, np.ndarray]:
        encoder = remote(remote_settings, server.url, observer=recorder)
        await encoder.start()
        try:
            first = await encoder.embed_texts(["海边的日落"])
            return first, await encoder.embed_texts(["海边的日落", "海边的日落"])
        finally:
            await encoder.close()

    first, again = asyncio.run(scenario())
    assert [(tower, items) for tower, _, items, _ in recorder.batches] == [("text", 1)]  # one request in all
    np.testing.assert_array_equal(again, np.repeat(first, 2, axis=0))


def test_server_down_retries_then_encoder_unavailable(remote_settings: Settings) -> None:
    encoder = remote(remote_settings, f"127.0.0.1:{free_port()}", retries=3, backoff_s=0.02)
    started = time.perf_counter()
    with pytest.raises(EncoderUnavailable) as err:
        asyncio.run(encoder.start())
    assert "cannot reach Triton server at 127.0.0.1:" in err.value.message
    assert "gave up after 4 attempts" in err.value.message
    assert err.value.code == "encoder_unavailable"
    # Backoff 0.02 · (1, 2, 4) with jitter ≥ 0.5: at least 70 ms of waiting, and nothing hangs.
    assert 0.07 <= time.perf_counter() - started < 5
    assert not encoder.ready


def test_5xx_is_retried_until_it_succeeds(remote_settings: Settings) -> None:
    flaky = FlakyEncoder(local_encoder(remote_settings), failures=2)
    with ServerThread(v2_app(flaky)) as flaky_server:

        async def scenario() -> np.ndarray:
            encoder = remote(remote_settings, flaky_server.url, retries=3, backoff_s=0.01)
            await encoder.start()
            try:
                return await encoder.embed_texts(["重试"])
            finally:
                await encoder.close()

        vector = asyncio.run(scenario())
        expected = flaky_server.call(flaky.inner.embed_texts(["重试"]))
    assert flaky.calls == 3  # two 503s, then the answer
    np.testing.assert_allclose(vector, expected, atol=1e-6)


def test_persistent_5xx_gives_up_with_the_server_message(remote_settings: Settings) -> None:
    flaky = FlakyEncoder(local_encoder(remote_settings), failures=100)
    with ServerThread(v2_app(flaky)) as flaky_server:

        async def scenario() -> None:
            encoder = remote(remote_settings, flaky_server.url, retries=2, backoff_s=0.01)
            await encoder.start()
            try:
                await encoder.embed_texts(["重试"])
            finally:
                await encoder.close()

        with pytest.raises(EncoderUnavailable, match="failed the cnclip_text inference with 503: simulated outage"):
            asyncio.run(scenario())
    assert flaky.calls == 3


def test_slow_server_times_out(remote_settings: Settings) -> None:
    slow = FlakyEncoder(local_encoder(remote_settings), delay_s=3.0)
    with ServerThread(v2_app(slow)) as slow_server:

        async def scenario() -> float:
            encoder = remote(remote_settings, slow_server.url)
            await encoder.start()  # metadata is fast; only inference is slow
            encoder.timeout_s = 0.3
            started = time.perf_counter()
            try:
                await encoder.embed_texts(["慢"])
            finally:
                await encoder.close()
            return time.perf_counter() - started

        with pytest.raises(EncoderUnavailable, match=r"did not answer the cnclip_text inference within 0.3 s"):
            asyncio.run(scenario())
    assert slow.calls == 1  # a timeout is not retried: resending work to a slow server only adds load


def test_missing_model_is_a_clear_error(remote_settings: Settings) -> None:
    def without_bytes_model(app: FastAPI) -> None:
        @app.get("/v2/models/cnclip_image_bytes")
        async def missing() -> JSONResponse:
            return JSONResponse({"error": "Request for unknown model: 'cnclip_image_bytes' is not found"}, 400)

    with ServerThread(v2_app(local_encoder(remote_settings), without_bytes_model)) as partial:
        encoder = remote(remote_settings, partial.url)
        with pytest.raises(ModelError) as err:
            asyncio.run(encoder.start())
    assert f"Triton server at {partial.url} has no model for the metadata of cnclip_image_bytes" in err.value.message
    assert not encoder.ready


def test_shapes_that_differ_from_the_manifest_refuse_to_start(server: ServerThread, remote_settings: Settings) -> None:
    manifest = ModelManifest.load(remote_settings.model_dir)
    wider = dataclasses.replace(manifest, embed_dim=512)
    with pytest.raises(ModelError) as err:
        asyncio.run(remote(remote_settings, server.url, manifest=wider).start())
    assert "outputs FP32 [-1, 32], but the manifest of toy has embed_dim 512" in err.value.message
    longer = dataclasses.replace(manifest, context_length=77)
    with pytest.raises(ModelError, match=r"takes INT64 \[-1, 52\], but the manifest of toy needs INT64 \[B, 77\]"):
        asyncio.run(remote(remote_settings, server.url, manifest=longer).start())


def test_bad_image_is_invalid_image_not_a_retry(server: ServerThread, remote_settings: Settings) -> None:
    async def scenario() -> None:
        encoder = remote(remote_settings, server.url)
        await encoder.start()
        try:
            await encoder.embed_images([b"GIF89a truncated"])
        finally:
            await encoder.close()

    with pytest.raises(InvalidImage) as err:
        asyncio.run(scenario())
    assert err.value.code == "invalid_image" and "rejected the cnclip_image_bytes inference" in err.value.message


def test_create_encoder_picks_triton_for_a_triton_url(remote_settings: Settings) -> None:
    from retrieval.encoder import LocalEncoder, create_encoder

    remote_encoder = create_encoder(remote_settings.model_copy(update={"encoder": "triton://10.1.2.3:8000"}))
    assert isinstance(remote_encoder, TritonEncoder) and remote_encoder.address == "10.1.2.3:8000"
    assert isinstance(create_encoder(remote_settings), LocalEncoder)
    env_settings = Settings(_env_file=None, model_dir=remote_settings.model_dir, encoder="http://gpu-1:8000")
    assert isinstance(create_encoder(env_settings), TritonEncoder)


def test_a_static_remote_model_gets_padded_batches(remote_settings: Settings) -> None:
    """A static export serves fixed shapes ([8, 52], files as [8, 1]); requests are padded to 8 and the
    padding dropped."""

    def static_metadata(app: FastAPI) -> None:
        shapes = {"cnclip_text": ("text", "INT64", [8, 52]), "cnclip_image_bytes": ("image_bytes", "BYTES", [8, 1])}
        for model, (name, datatype, shape) in shapes.items():
            out = "text_features" if model == "cnclip_text" else "image_features"

            async def metadata(
                model: str = model, name: str = name, datatype: str = datatype, shape: list = shape, out: str = out
            ) -> dict[str, Any]:
                return {
                    "name": model,
                    "inputs": [{"name": name, "datatype": datatype, "shape": shape}],
                    "outputs": [{"name": out, "datatype": "FP32", "shape": [8, 32]}],
                }

            app.get(f"/v2/models/{model}")(metadata)

    counting = FlakyEncoder(local_encoder(remote_settings))
    texts = [f"第{i}只猫" for i in range(11)]
    files = [image_file((40 * i, 100, 30)) for i in range(3)]
    with ServerThread(v2_app(counting, static_metadata)) as static_server:

        async def scenario() -> tuple[np.ndarray, np.ndarray]:
            encoder = remote(remote_settings, static_server.url)
            await encoder.start()
            try:
                return await encoder.embed_texts(texts), await encoder.embed_images(files)
            finally:
                await encoder.close()

        text, image = asyncio.run(scenario())
        expected_text = static_server.call(counting.inner.embed_texts(texts))
        expected_image = static_server.call(counting.inner.embed_images(files))
    assert sorted(counting.batch_sizes) == [8, 8, 8]  # 11 texts → 8 + 3 padded to 8; 3 images → 8
    assert text.shape == (11, 32) and image.shape == (3, 32)
    np.testing.assert_allclose(text, expected_text, atol=1e-6)
    np.testing.assert_allclose(image, expected_image, atol=1e-6)


class OutageEncoder(FlakyEncoder):
    """Serves `healthy_calls` image batches, then answers 503 until `healed` is set."""

    def __init__(self, inner: Any, healthy_calls: int) -> None:
        super().__init__(inner)
        self.healthy_calls, self.healed = healthy_calls, False

    async def _gate(self) -> None:
        self.calls += 1
        if self.calls > self.healthy_calls and not self.healed:
            raise EncoderUnavailable("simulated outage")


def test_an_outage_mid_index_ends_the_run_and_a_rerun_resumes(remote_settings: Settings, tmp_path: Path) -> None:
    """The index run stops with one error line when the remote encoder gives up (it used to hang with
    batches in flight), keeps what it committed, and the same command resumes once the server is back."""
    from indexer.storage.sql.db import create_db_engine
    from tests.support.indexer_helpers import cli_env, start_cli, write_images

    folder = tmp_path / "photos"
    write_images(folder, 24)
    database = f"sqlite:///{tmp_path / 'data' / 'catalog.db'}"
    outage = OutageEncoder(local_encoder(remote_settings), healthy_calls=3)
    with ServerThread(v2_app(outage)) as server:
        env = cli_env(tmp_path / "data", database, remote_settings.model_dir, CNCLIP_INDEX_BATCH_SIZE="2")
        env.update(CNCLIP_ENCODER=f"triton://{server.url}", CNCLIP_ENCODER_RETRIES="1", CNCLIP_PRECISION="fp32")
        first = start_cli(["index", str(folder), "--collection", "photos"], env)
        try:
            output, _ = first.communicate(timeout=60)
        finally:
            first.kill()  # no-op when it ended; a hung run must not outlive the test
        assert first.returncode == 1, output
        assert "failed the cnclip_image_bytes inference with 503: simulated outage" in output
        assert "Traceback" not in output and "never retrieved" not in output
        engine = create_db_engine(database)
        with engine.connect() as connection:
            kept = int(connection.exec_driver_sql("SELECT count(*) FROM items").scalar() or 0)
        engine.dispose()
        assert 0 < kept < 24

        outage.healed = True
        rerun = start_cli(["index", str(folder), "--collection", "photos"], env)
        try:
            output, _ = rerun.communicate(timeout=60)
        finally:
            rerun.kill()
    assert rerun.returncode == 0, output
    assert f"indexed {24 - kept} new" in output and f"unchanged {kept}" in output, output
