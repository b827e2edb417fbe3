"""`cnclip worker` (only the model, as its own process) and the split deployment: `cnclip serve` with
`CNCLIP_ENCODER=triton://worker`, end to end in two processes, including the worker restarting under load."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from fastapi.testclient import TestClient

from api.config import Settings
from retrieval.encoder import LocalEncoder
from tests.support.cli_server import CliServer, env_for
from tests.support.kserve_server import free_port, image_file, local_encoder


@pytest.fixture
def worker(toy_model_dir: Path, tmp_path: Path) -> Iterator[CliServer]:
    port = free_port()
    server = CliServer(["worker", "--port", str(port)], env_for(toy_model_dir, tmp_path / "w"), tmp_path / "worker.log")
    try:
        yield server.start()
    finally:
        server.stop()


def test_the_worker_serves_only_the_model(worker: CliServer, toy_model_dir: Path) -> None:
    # The provider/precision/buckets line of the design card, at start-up.
    assert "ready in" in worker.output() and "provider cpu (CNCLIP_PROVIDER=cpu)" in worker.output()
    assert "precision text=fp32 image=fp32; buckets [1, 4, 8]" in worker.output()
    for path in ("/healthz", "/readyz", "/v2", "/v2/health/ready", "/v2/models/cnclip_text/config"):
        assert httpx.get(worker.url + path).status_code == 200, path
    # No catalog, no REST API, no UI.
    for path in ("/", "/v1/collections", "/static/index.html"):
        assert httpx.get(worker.url + path).status_code == 404, path
    assert httpx.post(worker.url + "/v1/search/text", json={"query": "猫"}).status_code == 404

    client = triton_http.InferenceServerClient(worker.url.removeprefix("http://"))
    try:
        files = np.array([[image_file((200, 30, 30))]], dtype=np.object_)
        tensor = triton_http.InferInput("image_bytes", [1, 1], "BYTES")
        tensor.set_data_from_numpy(files)
        vector = client.infer("cnclip_image_bytes", [tensor]).as_numpy("image_features")
    finally:
        client.close()
    settings = Settings(_env_file=None, model_dir=toy_model_dir, provider="cpu", precision="fp32", buckets=[1])

    async def local() -> np.ndarray:
        encoder = LocalEncoder(settings)
        await encoder.start()
        try:
            return await encoder.embed_images([files[0, 0]])
        finally:
            await encoder.close()

    np.testing.assert_allclose(vector, asyncio.run(local()), atol=1e-6)
    metrics = httpx.get(worker.url + "/metrics").text
    assert 'cnclip_batch_size_count{tower="image"}' in metrics
    assert 'route="/v2/models/{name}/infer"' in metrics


def test_worker_app_readiness_follows_the_encoder(settings: Settings) -> None:
    from api.worker import create_worker_app

    app = create_worker_app(settings, encoder=local_encoder(settings))
    unready = TestClient(app)  # the lifespan has not run: the encoder is cold
    assert unready.get("/healthz").status_code == 200
    assert unready.get("/readyz").status_code == 503
    assert unready.get("/v2/health/ready").status_code == 400
    with TestClient(app) as started:
        assert started.get("/readyz").json() == {"status": "ready"}
        assert started.get("/v2/health/ready").status_code == 200


def test_worker_metrics_count_query_cache_hits_of_v2_text_requests(settings: Settings) -> None:
    from api.worker import create_worker_app
    from retrieval.tokenizer import tokenize

    encoder = local_encoder(settings.model_copy(update={"buckets": [1, 4, 8]}))
    ids = tokenize(["一张猫的照片"], context_length=encoder.context_length)
    body = {"inputs": [{"name": "text", "shape": list(ids.shape), "datatype": "INT64", "data": ids.ravel().tolist()}]}
    with TestClient(create_worker_app(settings, encoder=encoder)) as client:
        answers = [client.post("/v2/models/cnclip_text/infer", json=body) for _ in range(2)]
        metrics = client.get("/metrics").text
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json()["outputs"] == answers[1].json()["outputs"]
    assert 'cnclip_query_cache_misses_total{tower="text"} 1.0' in metrics
    assert 'cnclip_query_cache_hits_total{tower="text"} 1.0' in metrics


def test_query_cache_size_0_sends_every_v2_text_request_to_the_model(settings: Settings) -> None:
    # What a load test of /v2 relies on (benchmarks/bench_concurrency.py): a repeated input is not a cache hit.
    from api.worker import create_worker_app
    from retrieval.tokenizer import tokenize

    settings = settings.model_copy(update={"buckets": [1, 4, 8], "query_cache_size": 0})
    ids = tokenize(["一张猫的照片"])
    body = {"inputs": [{"name": "text", "shape": list(ids.shape), "datatype": "INT64", "data": ids.ravel().tolist()}]}
    # The worker's own encoder (not an injected one): its batches are counted in /metrics.
    with TestClient(create_worker_app(settings)) as client:
        answers = [client.post("/v2/models/cnclip_text/infer", json=body) for _ in range(3)]
        metrics = client.get("/metrics").text
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert 'cnclip_batch_size_count{tower="text"} 3.0' in metrics  # one batch per request: the model ran 3 times
    assert 'cnclip_query_cache_hits_total{tower="text"} 0.0' in metrics
    assert 'cnclip_query_cache_entries{tower="text"} 0.0' in metrics


def test_split_deployment_survives_a_worker_restart_under_load(
    worker: CliServer, toy_model_dir: Path, tmp_path: Path
) -> None:
    api_port = free_port()
    api_env = env_for(
        toy_model_dir,
        tmp_path / "api",
        CNCLIP_ENCODER=f"triton://{worker.url.removeprefix('http://')}",
        CNCLIP_ENCODER_RETRIES="2",
        CNCLIP_ENCODER_TIMEOUT_S="5",
    )
    api = CliServer(["serve", "--port", str(api_port)], api_env, tmp_path / "api.log").start()
    try:
        assert f"remote encoder: Triton at {worker.url.removeprefix('http://')} serves toy@" in api.output()
        http = httpx.Client(base_url=api.url, timeout=30)
        # End to end through both processes: texts in a collection, found by an image and by zero-shot.
        assert http.post("/v1/collections", json={"name": "captions", "kind": "texts"}).status_code == 201
        added = http.post("/v1/collections/captions/texts", json={"texts": ["一只猫", "一辆红色的汽车", "海边的日落"]})
        assert added.status_code == 201, added.text
        found = http.post(
            "/v1/search/image",
            files={"file": ("q.png", image_file((200, 30, 30)))},
            data={"collection": "captions", "target": "texts", "k": "3"},
        )
        assert found.status_code == 200 and len(found.json()["results"]) == 3, found.text
        labels = http.post("/v1/classify", files={"file": ("q.png", image_file((9, 9, 9)))}, data={"labels": "猫,狗"})
        assert labels.status_code == 200 and abs(sum(p["probability"] for p in labels.json()) - 1) < 1e-5

        # Load from 4 clients while the worker goes down and comes back.
        results: list[tuple[float, int, str]] = []  # (seconds, status, error code)
        stop = threading.Event()

        def client(index: int) -> None:
            with httpx.Client(base_url=api.url, timeout=30) as own:
                i = 0
                while not stop.is_set():
                    started = time.perf_counter()
                    response = own.post("/v1/embed/text", json={"texts": [f"第{index}-{i}句"]})
                    code = response.json()["error"]["code"] if response.status_code != 200 else ""
                    results.append((time.perf_counter() - started, response.status_code, code))
                    i += 1
                    time.sleep(0.01)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(0.5)
            worker.stop(signal.SIGKILL)  # a crash, not a drain
            time.sleep(1.0)
            down_at = len(results)
            worker.start()  # the same command on the same port
            deadline = time.monotonic() + 30
            while not any(status == 200 for _, status, _ in results[down_at:]) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        statuses = {status for _, status, _ in results}
        assert statuses == {200, 503}, statuses  # nothing else: no 500, no hang
        failed = [(seconds, code) for seconds, status, code in results if status == 503]
        assert {code for _, code in failed} == {"encoder_unavailable"}
        assert max(seconds for seconds, _ in failed) < 3, "503s must come fast (a few quick retries, no hang)"
        assert results[-1][1] == 200  # recovered
        assert api.process is not None and api.process.poll() is None  # without restarting the API
        assert http.post("/v1/embed/text", json={"texts": ["恢复"]}).status_code == 200
        http.close()
    finally:
        api.stop()


def test_serve_logs_the_provider_line(toy_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    serve = CliServer(["serve", "--port", str(port)], env_for(toy_model_dir, tmp_path), tmp_path / "serve.log")
    try:
        serve.start()
        line = next(line for line in serve.output().splitlines() if "ready in" in line)
        assert "provider cpu (CNCLIP_PROVIDER=cpu); precision text=fp32 image=fp32; buckets [1, 4, 8]" in line
    finally:
        serve.stop()


def test_worker_without_a_model_fails_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import build_cli

    monkeypatch.setenv("CNCLIP_MODEL_DIR", str(tmp_path / "nothing-here"))
    monkeypatch.setenv("CNCLIP_ENCODER", "triton://elsewhere:8001")  # ignored: the worker runs the model itself
    result = CliRunner().invoke(build_cli(), ["worker", "--port", str(free_port())])
    assert result.exit_code == 2
    assert "no manifest.json" in result.output and "Traceback" not in result.output
