"""Each route's body budget (api/body_budget.py): the largest legal request still passes, one past the
budget is a 413 in the prefix's error shape, and what the budget lets through is reported as before."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.config import Settings
from api.kserve_tensors import MAX_BATCH, MAX_JSON_TENSOR_VALUES
from api.schemas import MAX_TAGS, MAX_TEXTS_PER_REQUEST, StrictModel
from tests.support.api_helpers import api_client
from tests.support.kserve_server import local_encoder, v2_app


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with api_client(settings) as test_client:
        yield test_client


def test_the_largest_add_texts_request_passes_its_own_budget(client: TestClient) -> None:
    """1000 texts with 50 tags each are ~53k JSON values: over the default budget, within AddTextsRequest's."""
    assert client.post("/v1/collections", json={"name": "captions2", "kind": "texts"}).status_code == 201
    texts = [{"text": f"第{i}句", "tags": [f"t{j}" for j in range(MAX_TAGS)]} for i in range(MAX_TEXTS_PER_REQUEST)]
    response = client.post("/v1/collections/captions2/texts", json={"texts": texts})
    assert response.status_code == 201, response.text[:300]
    assert len(response.json()["items"]) == MAX_TEXTS_PER_REQUEST


def test_a_body_over_its_schemas_value_budget_is_a_413_in_the_v1_shape(client: TestClient) -> None:
    over = {"query": "猫", **{f"k{i}": 0 for i in range(StrictModel.max_json_values)}}
    response = client.post("/v1/search/text", json=over)
    assert response.status_code == 413
    assert response.json() == {
        "error": {
            "code": "payload_too_large",
            "message": "the request body holds more than 4,096 JSON values; send fewer items per request",
        }
    }
    within = {"query": "猫", **{f"k{i}": 0 for i in range(100)}}  # within the budget: validated as before
    response = client.post("/v1/search/text", json=within)
    assert response.status_code == 422 and "(and 97 more)" in response.json()["error"]["message"]


def test_a_body_over_its_byte_budget_is_a_413(client: TestClient) -> None:
    padded = b'{"query": "cat"' + b" " * StrictModel.max_body_bytes + b"}"
    response = client.post("/v1/search/text", content=padded, headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"


def test_bodies_within_budget_parse_as_before(client: TestClient) -> None:
    response = client.post("/v1/search/text", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["error"]["code"] == "invalid_input"
    body = json.dumps({"query": "猫", "k": 3}).encode()
    response = client.post("/v1/search/text", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 404, response.text  # parsed and validated: the empty catalog answers
    response = client.post("/v1/search/text", content=body)  # no content type: FastAPI's strict rule, as before
    assert response.status_code == 422 and "valid dictionary" in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def v2_client(toy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    data_dir = tmp_path_factory.mktemp("v2-limits")
    settings = Settings(_env_file=None, model_dir=toy_model_dir, data_dir=data_dir, provider="cpu", buckets=[1, 4])
    with TestClient(v2_app(local_encoder(settings))) as test_client:
        yield test_client


def _text_request(rows: int) -> dict[str, object]:
    return {"inputs": [{"name": "text", "shape": [rows, 52], "datatype": "INT64", "data": [[0] * 52] * rows}]}


def test_v2_takes_its_largest_json_batch_even_gzipped(v2_client: TestClient) -> None:
    body = gzip.compress(json.dumps(_text_request(MAX_BATCH)).encode())
    response = v2_client.post(
        "/v2/models/cnclip_text/infer", content=body, headers={"Content-Encoding": "gzip"}, timeout=60
    )
    assert response.status_code == 200, response.text[:300]
    assert response.json()["outputs"][0]["shape"][0] == MAX_BATCH


def test_v2_json_past_the_models_budget_is_a_413_in_tritons_shape(v2_client: TestClient) -> None:
    over_the_batch = _text_request(MAX_BATCH + 44)
    response = v2_client.post("/v2/models/cnclip_text/infer", json=over_the_batch)
    assert response.status_code == 400, response.text  # the batch check's answer, as Triton's (not the budget's)
    assert "batch" in response.json()["error"]
    too_many = _text_request(2 * MAX_BATCH)
    too_many["inputs"][0]["data"] += [[0] * 52] * 40  # type: ignore[index]
    response = v2_client.post("/v2/models/cnclip_text/infer", json=too_many)
    assert response.status_code == 413
    assert response.json() == {
        "error": "the request body holds more than 28,160 JSON values; send fewer items per request"
    }


def test_v2_fp32_json_is_capped_binary_is_not(v2_client: TestClient) -> None:
    """JSON tensors are parsed into Python floats holding the GIL; past 2^19 values, the binary extension."""
    images = MAX_JSON_TENSOR_VALUES // (3 * 224 * 224) + 1  # 4 images
    body = json.dumps(
        {
            "inputs": [
                {"name": "image", "shape": [images, 3, 224, 224], "datatype": "FP32", "data": [0.0] * (images * 150528)}
            ]
        }
    )
    response = v2_client.post("/v2/models/cnclip_image/infer", content=body)
    assert response.status_code == 413 and "JSON values" in response.json()["error"]
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "shape": [images, 3, 224, 224],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": images * 150528 * 4},
                }
            ]
        }
    ).encode()
    binary = b"\x00" * (images * 150528 * 4)
    response = v2_client.post(
        "/v2/models/cnclip_image/infer",
        content=header + binary,
        headers={"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"},
        timeout=60,
    )
    assert response.status_code == 200, response.text[:300]


def test_v2_repository_index_takes_small_bodies_only(v2_client: TestClient) -> None:
    assert v2_client.post("/v2/repository/index", json={"ready": True}).status_code == 200
    response = v2_client.post("/v2/repository/index", content=b"[" + b"0," * 40_000 + b"0]")
    assert response.status_code == 413 and set(response.json()) == {"error"}
