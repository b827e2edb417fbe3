"""Bad requests: every 4xx/5xx has the one shape `{"error": {"code", "message"}}`, the right
status, a clear message and never raw exception text; the API key guards writes (and reads)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from api.config import Settings
from retrieval.errors import Overloaded
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import api_client, image_bytes, seed


def assert_error(response, status: int, code: str, *message_parts: str) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code, body
    for part in message_parts:
        assert part in body["error"]["message"], body
    return body


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> Iterator[TestClient]:
    """One seeded app for the read-only bad-request cases (seeding per case would dominate the run)."""
    data_dir = tmp_path_factory.mktemp("api-errors")
    settings = Settings(_env_file=None, model_dir=toy_model_dir, data_dir=data_dir, provider="cpu")
    with api_client(settings, raise_server_exceptions=False) as c:
        seed(c)
        yield c


def png() -> tuple[str, bytes, str]:
    return ("x.png", image_bytes((5, 6, 7)), "image/png")


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code", "part"),
    [
        ("get", "/v1/nope", {}, 404, "not_found", "no such route"),
        ("delete", "/v1/search/text", {}, 405, "method_not_allowed", "DELETE"),
        (
            "post",
            "/v1/search/text",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            422,
            "invalid_input",
            "",
        ),
        ("post", "/v1/search/text", {"json": {}}, 422, "invalid_input", "query"),
        ("post", "/v1/search/text", {"json": {"query": "猫" * 513}}, 422, "invalid_input", "512"),
        ("post", "/v1/search/text", {"json": {"query": "   "}}, 422, "invalid_input", "query"),
        ("post", "/v1/search/text", {"json": {"query": "猫", "k": 0}}, 422, "invalid_input", "k"),
        ("post", "/v1/search/text", {"json": {"query": "猫", "k": 201}}, 422, "invalid_input", "200"),
        ("post", "/v1/search/text", {"json": {"query": "猫", "bogus": 1}}, 422, "invalid_input", "bogus"),
        ("post", "/v1/search/text", {"json": {"query": "猫", "collection": "nope"}}, 404, "not_found", "nope"),
        ("post", "/v1/search/text", {"json": {"query": "猫", "collection": "captions"}}, 422, "invalid_input", "texts"),
        (
            "post",
            "/v1/search/text",
            {"json": {"query": "猫", "collection": "../etc"}},
            422,
            "invalid_input",
            "collection",
        ),
        ("get", "/v1/items/987654", {}, 404, "not_found", "987654"),
        ("get", "/v1/items/abc", {}, 422, "invalid_input", "item_id"),
        ("get", "/v1/items/987654/image", {}, 404, "not_found", "987654"),
        ("get", "/v1/items/987654/thumbnail", {}, 404, "not_found", ""),
        ("delete", "/v1/items/987654", {}, 404, "not_found", ""),
        ("get", "/v1/label-sets/nope", {}, 404, "not_found", "nope"),
        ("put", "/v1/label-sets/x", {"json": {"labels": []}}, 422, "invalid_input", "labels"),
        ("put", "/v1/label-sets/x", {"json": {"labels": ["a"] * 101}}, 422, "invalid_input", "100"),
        (
            "put",
            "/v1/label-sets/x",
            {"json": {"labels": ["a", "b"], "templates": ["no slot"]}},
            422,
            "invalid_input",
            "{}",
        ),
        ("post", "/v1/embed/text", {"json": {"texts": []}}, 422, "invalid_input", "texts"),
        ("post", "/v1/collections", {"json": {"name": "photos", "kind": "images"}}, 409, "conflict", "photos"),
        ("post", "/v1/collections/nope/texts", {"json": {"texts": ["a"]}}, 404, "not_found", "nope"),
        ("post", "/v1/collections/photos/texts", {"json": {"texts": ["a"]}}, 422, "invalid_input", "images"),
    ],
)
def test_bad_requests_share_one_error_shape(
    client: TestClient, method: str, path: str, kwargs: dict, status: int, code: str, part: str
) -> None:
    assert_error(getattr(client, method)(path, **kwargs), status, code, part)


def test_upload_limits(settings: Settings) -> None:
    small = settings.model_copy(update={"max_image_bytes": 4000, "max_image_pixels": 100 * 100})
    with api_client(small) as client:
        seed(client)
        big = image_bytes((1, 2, 3), size=(90, 90), fmt="BMP")  # 24 KB, under the pixel cap
        assert len(big) > 4000
        r = client.post("/v1/search/image", files={"file": ("big.bmp", big, "image/bmp")})
        assert_error(r, 413, "payload_too_large", "4000")
        r = client.post(
            "/v1/search/image", files={"file": ("wide.png", image_bytes((1, 2, 3), size=(200, 60)), "image/png")}
        )
        assert_error(r, 422, "image_too_large", "the limit is 10,000 pixels")  # not "cannot read": its own code
        r = client.post("/v1/search/image", files={"file": ("x.png", b"definitely not an image", "image/png")})
        assert_error(r, 422, "invalid_image")
        r = client.post("/v1/search/image", files={"file": ("x.png", b"", "image/png")})
        assert_error(r, 422, "invalid_image", "empty")
        # A body far over the cap is refused from its Content-Length, before the form is parsed.
        r = client.post("/v1/embed/image", files={"file": ("huge.png", b"\0" * (2 << 20), "image/png")})
        assert_error(r, 413, "payload_too_large")


def test_classify_validation(client: TestClient) -> None:
    r = client.post("/v1/classify", files={"file": png()})
    assert_error(r, 422, "invalid_input", "labels")
    r = client.post("/v1/classify", files={"file": png()}, data={"labels": json.dumps([f"l{i}" for i in range(101)])})
    assert_error(r, 422, "invalid_input", "at most 100")
    r = client.post("/v1/classify", files={"file": png()}, data={"labels": "[broken"})
    assert_error(r, 422, "invalid_input", "JSON")
    r = client.post("/v1/classify", files={"file": png()}, data={"labels": "猫,猫"})
    assert_error(r, 422, "invalid_input", "distinct")
    r = client.post("/v1/classify", files={"file": png()}, data={"labels": "猫,狗", "templates": '["没有占位"]'})
    assert_error(r, 422, "invalid_input", "{}")
    r = client.post("/v1/classify", files={"file": png()}, data={"label_set": "nope"})
    assert_error(r, 404, "not_found", "nope")
    r = client.post("/v1/classify", data={"labels": "猫,狗"})
    assert_error(r, 422, "invalid_input", "file")


class _BrokenEncoder(FakeEncoder):
    """Fails the way a real encoder can: overloaded batcher, or a bug with a revealing message."""

    def __init__(self, failure: Exception) -> None:
        super().__init__()
        self.failure = failure

    async def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        raise self.failure


def test_overloaded_encoder_answers_429_with_retry_after(settings: Settings) -> None:
    with api_client(settings, encoder=_BrokenEncoder(Overloaded("the text queue is full", retry_after=2.5))) as c:
        seed_only_images = c.post("/v1/collections", json={"name": "p", "kind": "images"})
        assert seed_only_images.status_code == 201
        r = c.post("/v1/search/text", json={"query": "猫"})
        assert_error(r, 429, "overloaded", "queue is full")
        assert r.headers["retry-after"] == "3"


def test_unexpected_errors_never_leak_their_text(settings: Settings) -> None:
    secret = RuntimeError("/secret/path/model.onnx: tensor shape mismatch at node 42")
    with api_client(settings, encoder=_BrokenEncoder(secret), raise_server_exceptions=False) as c:
        r = c.post("/v1/embed/text", json={"texts": ["猫"]})
        body = assert_error(r, 500, "internal_error")
        assert body["error"]["message"] == f"internal server error (request id {r.headers['x-request-id']})"
        assert "secret" not in r.text and "node 42" not in r.text


def test_readyz_is_503_before_the_encoder_is_warm(settings: Settings) -> None:
    encoder = FakeEncoder()
    with api_client(settings, encoder=encoder) as c:
        assert c.get("/readyz").status_code == 200
        encoder._ready = False  # as while a real encoder is still compiling its buckets
        assert_error(c.get("/readyz"), 503, "encoder_unavailable", "warming")
        assert_error(c.post("/v1/embed/text", json={"texts": ["猫"]}), 503, "encoder_unavailable")


def test_api_key_guards_writes_and_optionally_reads(settings: Settings) -> None:
    keyed = settings.model_copy(update={"api_key": SecretStr("s3cret-key")})
    with api_client(keyed) as c:
        assert_error(c.post("/v1/collections", json={"name": "p", "kind": "images"}), 401, "unauthorized", "API key")
        r = c.post("/v1/collections", json={"name": "p", "kind": "images"}, headers={"Authorization": "Bearer wrong"})
        assert_error(r, 401, "unauthorized", "wrong")
        assert r.headers["www-authenticate"] == "Bearer"
        assert_error(c.put("/v1/label-sets/a", json={"labels": ["x"]}), 401, "unauthorized")
        seed(c, headers={"Authorization": "Bearer s3cret-key"})
        r = c.post("/v1/collections", json={"name": "q", "kind": "texts"}, headers={"X-API-Key": "s3cret-key"})
        assert r.status_code == 201
        assert_error(c.delete("/v1/items/1"), 401, "unauthorized")
        # Reads stay open unless require_key_for_reads is set.
        assert c.post("/v1/search/text", json={"query": "猫"}).status_code == 200

    locked = keyed.model_copy(update={"require_key_for_reads": True})
    with api_client(locked) as c:
        assert_error(c.post("/v1/search/text", json={"query": "猫"}), 401, "unauthorized")
        assert_error(c.get("/v1/collections"), 401, "unauthorized")
        assert_error(c.get("/metrics"), 401, "unauthorized")
        assert c.get("/v1/collections", headers={"X-API-Key": "s3cret-key"}).status_code == 200
        assert c.get("/healthz").status_code == 200  # probes never need the key
