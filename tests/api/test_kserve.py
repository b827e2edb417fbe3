"""The KServe v2 endpoints, driven by the real `tritonclient.http` over loopback HTTP."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from fastapi.testclient import TestClient
from pydantic import SecretStr
from tritonclient.utils import InferenceServerException

from api.config import Settings
from retrieval.preprocess import preprocess_image
from retrieval.tokenizer import tokenize
from tests.support.kserve_server import ServerThread, image_file, local_encoder, v2_app


@pytest.fixture(scope="module")
def v2_settings(toy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    data_dir = tmp_path_factory.mktemp("kserve-data")
    return Settings(_env_file=None, model_dir=toy_model_dir, data_dir=data_dir, provider="cpu", buckets=[1, 4, 8])


@pytest.fixture(scope="module")
def server(v2_settings: Settings) -> Iterator[ServerThread]:
    with ServerThread(v2_app(local_encoder(v2_settings))) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[triton_http.InferenceServerClient]:
    triton = triton_http.InferenceServerClient(server.url, network_timeout=30)
    yield triton
    triton.close()


def infer(
    client: triton_http.InferenceServerClient, model: str, name: str, datatype: str, data: np.ndarray, binary: bool
) -> np.ndarray:
    tensor = triton_http.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=binary)
    output = "text_features" if model == "cnclip_text" else "image_features"
    result = client.infer(model, [tensor], outputs=[triton_http.InferRequestedOutput(output, binary_data=binary)])
    features = result.as_numpy(output)
    assert features is not None
    return features


def test_health_and_server_metadata(client: triton_http.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "cnclip"
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata_reports_the_manifest_shapes(client: triton_http.InferenceServerClient) -> None:
    text = client.get_model_metadata("cnclip_text")
    assert text["inputs"] == [{"name": "text", "datatype": "INT64", "shape": [-1, 52]}]
    assert text["outputs"] == [{"name": "text_features", "datatype": "FP32", "shape": [-1, 32]}]
    image = client.get_model_metadata("cnclip_image")
    assert image["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 224, 224]}]
    image_bytes = client.get_model_metadata("cnclip_image_bytes", model_version="1")
    # One file per row, [-1, 1], as the exported Triton ensemble; [n] is accepted too.
    assert image_bytes["inputs"] == [{"name": "image_bytes", "datatype": "BYTES", "shape": [-1, 1]}]
    assert image_bytes["outputs"] == [{"name": "image_features", "datatype": "FP32", "shape": [-1, 32]}]
    for model in ("cnclip_text", "cnclip_image", "cnclip_image_bytes"):
        assert client.is_model_ready(model)


def test_unknown_model_is_a_v2_404(server: ServerThread, client: triton_http.InferenceServerClient) -> None:
    assert not client.is_model_ready("resnet50")
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("resnet50")
    assert err.value.status() == "404"
    assert "unknown model 'resnet50'" in err.value.message()
    response = httpx.post(f"http://{server.url}/v2/models/cnclip_text/versions/7/infer", json={"inputs": []})
    assert response.status_code == 404
    assert response.json() == {"error": "model 'cnclip_text' has no version '7' (only '1')"}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_text_round_trip_equals_local_encoder(
    server: ServerThread, client: triton_http.InferenceServerClient, binary: bool
) -> None:
    ids = tokenize(["穿红色裙子的女孩", "一只猫", "a red car 汽车"])
    features = infer(client, "cnclip_text", "text", "INT64", ids, binary)
    expected = server.call(server.app.state.encoder.embed_token_ids(ids))
    assert features.shape == (3, 32) and features.dtype == np.float32
    np.testing.assert_allclose(features, expected, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(features, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_image_pixels_and_bytes_round_trip(
    server: ServerThread, client: triton_http.InferenceServerClient, binary: bool
) -> None:
    files = [image_file((200, 30, 30)), image_file((20, 40, 220), fmt="JPEG")]
    pixels = np.stack([preprocess_image(f) for f in files])
    from_pixels = infer(client, "cnclip_image", "image", "FP32", pixels, binary)
    if binary:
        raw = np.array(files, dtype=np.object_)
    else:  # JSON cannot carry raw bytes: the elements are base64 strings
        raw = np.array([base64.b64encode(f) for f in files], dtype=np.object_)
    from_bytes = infer(client, "cnclip_image_bytes", "image_bytes", "BYTES", raw, binary)
    expected = server.call(server.app.state.encoder.embed_images(files))
    assert from_bytes.shape == (2, 32)
    np.testing.assert_allclose(from_bytes, expected, atol=1e-6)
    np.testing.assert_allclose(from_pixels, expected, atol=1e-5)
    assert float(from_bytes[0] @ from_bytes[1]) < 0.999  # two different images, two different vectors


def test_bytes_input_of_shape_n_by_1_is_accepted(client: triton_http.InferenceServerClient) -> None:
    # What a client of a real Triton ensemble (dims [1] per item) sends.
    files = np.array([[image_file((10, 200, 10))]], dtype=np.object_)
    assert infer(client, "cnclip_image_bytes", "image_bytes", "BYTES", files, True).shape == (1, 32)


def test_bad_image_is_a_v2_400(client: triton_http.InferenceServerClient) -> None:
    files = np.array([image_file((1, 2, 3)), b"<html>not an image</html>"], dtype=np.object_)
    with pytest.raises(InferenceServerException) as err:
        infer(client, "cnclip_image_bytes", "image_bytes", "BYTES", files, True)
    assert err.value.status() == "400"
    assert "image" in err.value.message().lower()


@pytest.mark.parametrize(
    ("model", "name", "datatype", "data", "message"),
    [
        (
            "cnclip_text",
            "text",
            "INT64",
            np.zeros((2, 40), np.int64),
            "has shape [2, 40]; model 'cnclip_text' expects [-1, 52]",
        ),
        ("cnclip_text", "text", "INT32", np.zeros((1, 52), np.int32), "must be INT64, got INT32"),
        ("cnclip_text", "ids", "INT64", np.zeros((1, 52), np.int64), "takes exactly one input 'text', got ['ids']"),
        ("cnclip_text", "text", "INT64", np.full((1, 52), 99999, np.int64), "token ids must lie in [0, 21128)"),
        ("cnclip_image", "image", "FP32", np.zeros((1, 3, 64, 64), np.float32), "expects [-1, 3, 224, 224]"),
        ("cnclip_image", "image", "FP32", np.full((1, 3, 224, 224), np.nan, np.float32), "NaN or infinity"),
    ],
)
def test_inputs_that_break_the_model_contract_are_400(
    client: triton_http.InferenceServerClient, model: str, name: str, datatype: str, data: np.ndarray, message: str
) -> None:
    with pytest.raises(InferenceServerException) as err:
        infer(client, model, name, datatype, data, True)
    assert err.value.status() == "400"
    assert message in err.value.message()


def test_malformed_bodies_are_v2_400s(server: ServerThread) -> None:
    url = f"http://{server.url}/v2/models/cnclip_text/infer"
    not_json = httpx.post(url, content=b"{not json")
    assert not_json.status_code == 400
    assert set(not_json.json()) == {"error"} and "malformed inference request" in not_json.json()["error"]
    header = json.dumps(
        {"inputs": [{"name": "text", "shape": [1, 52], "datatype": "INT64", "parameters": {"binary_data_size": 416}}]}
    ).encode()
    short = httpx.post(url, content=header + b"\0" * 100, headers={"Inference-Header-Content-Length": str(len(header))})
    assert short.status_code == 400
    assert short.json() == {"error": "input 'text' declares 416 bytes of binary data, the body carries 100"}
    too_many = httpx.post(url, json={"inputs": [{"name": "text", "shape": [1, 52], "datatype": "INT64", "data": [1]}]})
    assert too_many.json() == {"error": "input 'text' has 1 elements, its shape [1, 52] needs 52"}


def test_json_response_without_binary_extension(server: ServerThread) -> None:
    ids = tokenize(["你好"])[0].tolist()
    body = {"id": "42", "inputs": [{"name": "text", "shape": [1, 52], "datatype": "INT64", "data": [ids]}]}
    response = httpx.post(f"http://{server.url}/v2/models/cnclip_text/infer", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    payload = response.json()
    assert payload["id"] == "42" and payload["model_name"] == "cnclip_text"
    (output,) = payload["outputs"]
    assert output["shape"] == [1, 32] and len(output["data"]) == 32


def test_not_ready_encoder_answers_like_triton(v2_settings: Settings) -> None:
    app = v2_app(local_encoder(v2_settings))
    unready = TestClient(app)  # without `with`, the lifespan never starts the encoder
    assert unready.get("/v2/health/live").status_code == 200
    # Triton answers 400 (empty body) while not ready; inference answers 503, which clients retry.
    assert unready.get("/v2/health/ready").status_code == 400
    assert unready.get("/v2/models/cnclip_text/ready").status_code == 400
    response = unready.post("/v2/models/cnclip_text/infer", json={"inputs": []})
    assert response.status_code == 503
    assert response.json() == {"error": "model 'cnclip_text' is not ready"}
    with TestClient(app) as started:
        assert started.get("/v2/health/ready").status_code == 200
        assert started.get("/v2/models/cnclip_image_bytes/ready").status_code == 200


def test_api_key_guards_inference_but_not_health(v2_settings: Settings) -> None:
    locked = v2_settings.model_copy(update={"api_key": SecretStr("s3cret"), "require_key_for_reads": True})
    with ServerThread(v2_app(local_encoder(locked))) as server:
        triton = triton_http.InferenceServerClient(server.url)
        try:
            assert triton.is_server_ready()  # load balancers probe without a key
            ids = tokenize(["钥匙"])
            with pytest.raises(InferenceServerException) as err:
                infer(triton, "cnclip_text", "text", "INT64", ids, True)
            assert err.value.status() == "401" and "API key" in err.value.message()
            tensor = triton_http.InferInput("text", [1, 52], "INT64")
            tensor.set_data_from_numpy(ids)
            result = triton.infer("cnclip_text", [tensor], headers={"Authorization": "Bearer s3cret"})
            assert result.as_numpy("text_features").shape == (1, 32)
        finally:
            triton.close()


def test_the_service_app_serves_v2(settings: Settings) -> None:
    from api.app import create_app

    settings = settings.model_copy(update={"buckets": [1, 4]})
    encoder = local_encoder(settings)
    with TestClient(create_app(settings, encoder=encoder)) as http:
        assert http.get("/v2/health/ready").status_code == 200
        assert http.get("/v2/models/cnclip_text").json()["outputs"][0]["shape"] == [-1, 32]
        ids = tokenize(["服务"])
        body = {"inputs": [{"name": "text", "shape": [1, 52], "datatype": "INT64", "data": ids.tolist()}]}
        answer = http.post("/v2/models/cnclip_text/infer", json=body).json()
        np.testing.assert_allclose(
            answer["outputs"][0]["data"], http.portal.call(encoder.embed_token_ids, ids)[0], atol=1e-6
        )
