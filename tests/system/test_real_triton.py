"""The exported repository (`--backend python`) in a real Triton Inference Server, and golden tests:
the same calls sent to that Triton and to our service (`create_app`, what `cnclip serve` runs) give
responses of the same structure (status codes, keys, value types).

The server is nvidia-pytriton's `tritonserver` (Triton 2.51, Python backend; see tests/support/real_triton.py),
one per module, on the toy model.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_aio
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from api.config import Settings
from retrieval.preprocess import preprocess_image
from retrieval.tokenizer import tokenize
from tests.support.kserve_server import ServerThread, image_file, local_encoder
from tests.support.real_triton import RealTriton, unavailable_reason
from tests.support.triton_configs import parse_config

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))

TRITON_PAGE = Path(__file__).resolve().parents[2] / "docs" / "triton.md"

MODELS = ("cnclip_text", "cnclip_image", "cnclip_image_bytes")


@pytest.fixture(scope="module")
def triton(python_repo: Path) -> Iterator[RealTriton]:
    with RealTriton(python_repo) as server:
        yield server


@pytest.fixture(scope="module")
def fp32_settings(toy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    # fp32, as exported: the toy model's int8 graphs would be chosen on a CPU otherwise.
    data_dir = tmp_path_factory.mktemp("golden-data")
    return Settings(
        _env_file=None, model_dir=toy_model_dir, data_dir=data_dir, provider="cpu", precision="fp32", buckets=[1, 4, 8]
    )


@pytest.fixture(scope="module")
def ours(fp32_settings: Settings) -> Iterator[ServerThread]:
    """Our whole service (REST API, UI and /v2) on a local encoder, as `cnclip serve` runs it."""
    from api.app import create_app

    with ServerThread(create_app(fp32_settings, encoder=local_encoder(fp32_settings))) as server:
        yield server


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def infer(url: str, model: str, name: str, datatype: str, data: np.ndarray, **kwargs: Any) -> np.ndarray:
    client = triton_http.InferenceServerClient(url, network_timeout=60)
    try:
        tensor = triton_http.InferInput(name, list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        output = "text_features" if model == "cnclip_text" else "image_features"
        result = client.infer(model, [tensor], **kwargs)
        features = result.as_numpy(output)
        assert features is not None
        return features
    finally:
        client.close()


# --- the exported repository in Triton --------------------------------------------------------------


def test_every_model_of_the_repository_loads(triton: RealTriton) -> None:
    index = httpx.post(f"http://{triton.url}/v2/repository/index", json={}).json()
    assert sorted((m["name"], m["state"]) for m in index) == [
        ("cnclip_image", "READY"),
        ("cnclip_image_bytes", "READY"),
        ("cnclip_text", "READY"),
        ("preprocess", "READY"),
    ]
    client = triton_http.InferenceServerClient(triton.url)
    try:
        # The towers run in the Python backend and batch dynamically, the ensemble batches end to end.
        for name in ("cnclip_text", "cnclip_image"):
            config = client.get_model_config(name)
            assert config["backend"] == "python" and config["max_batch_size"] == 16
            assert config["dynamic_batching"]["preferred_batch_size"] == [4, 8, 16]
        assert client.get_model_config("cnclip_image_bytes")["platform"] == "ensemble"
        meta = client.get_model_metadata("cnclip_image_bytes")
        assert meta["inputs"] == [{"name": "image_bytes", "datatype": "BYTES", "shape": [-1, 1]}]
    finally:
        client.close()
    assert "ONNX Runtime on cpu" in triton.log_path.read_text(encoding="utf-8", errors="replace")


def test_vectors_equal_the_in_process_encoder(triton: RealTriton, ours: ServerThread) -> None:
    local = ours.app.state.encoder
    ids = tokenize(["穿红色裙子的女孩", "一只猫", "a red car 汽车", "海边的日落", "城市夜景"])
    files = [image_file((200, 30, 30)), image_file((20, 40, 220), fmt="JPEG"), image_file((90, 200, 90), (300, 120))]
    pixels = np.stack([preprocess_image(f) for f in files])

    text = infer(triton.url, "cnclip_text", "text", "INT64", ids)
    from_pixels = infer(triton.url, "cnclip_image", "image", "FP32", pixels)
    from_bytes = infer(
        triton.url, "cnclip_image_bytes", "image_bytes", "BYTES", np.array(files, dtype=np.object_).reshape(-1, 1)
    )
    expected_text = ours.call(local.embed_token_ids(ids))
    expected_image = ours.call(local.embed_images(files))
    assert text.shape == (5, 32) and from_bytes.shape == (3, 32) and from_bytes.dtype == np.float32
    assert cosines(text, expected_text).min() >= 0.99999
    assert cosines(from_pixels, expected_image).min() >= 0.99999
    assert cosines(from_bytes, expected_image).min() >= 0.99999  # Triton's preprocess = ours
    assert float(from_bytes[0] @ from_bytes[1]) < 0.999


def test_concurrent_requests_are_batched_by_triton(triton: RealTriton) -> None:
    ids = tokenize([f"第{i}张照片" for i in range(48)])

    async def burst() -> list[np.ndarray]:
        client = triton_aio.InferenceServerClient(triton.url)
        try:

            async def one(row: np.ndarray) -> np.ndarray:
                tensor = triton_aio.InferInput("text", [1, 52], "INT64")
                tensor.set_data_from_numpy(row[None])
                return (await client.infer("cnclip_text", [tensor])).as_numpy("text_features")[0]

            async def counts() -> tuple[int, int]:
                stats = (await client.get_inference_statistics("cnclip_text"))["model_stats"][0]
                return int(stats["inference_count"]), int(stats["execution_count"])

            before = await counts()
            vectors = await asyncio.gather(*(one(row) for row in ids))
            # Triton counts a request after its answer is sent: the last few may lag the answers a moment.
            deadline = time.monotonic() + 10
            while (after := await counts())[0] - before[0] < len(ids) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await client.close()
        items, executions = after[0] - before[0], after[1] - before[1]
        assert items == 48 and executions < 48, f"{items} items in {executions} executions: nothing was batched"
        return vectors

    vectors = np.stack(asyncio.run(burst()))
    alone = infer(triton.url, "cnclip_text", "text", "INT64", ids[:16])
    assert cosines(vectors[:16], alone).min() >= 0.99999


def documented_tritonclient_example() -> str:
    """The Triton page's tritonclient example (its one ```python block that imports tritonclient)."""
    blocks = re.findall(r"```python\n(.*?)```", TRITON_PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    examples = [block for block in blocks if "import tritonclient" in block]
    assert len(examples) == 1, f"{len(examples)} tritonclient examples in docs/triton.md"
    return examples[0]


@pytest.mark.parametrize("server", ["triton", "ours"])
def test_the_documented_tritonclient_example_works(
    request: pytest.FixtureRequest, server: str, ours: ServerThread, tmp_path: Path
) -> None:
    """docs/triton.md's snippet, as written there, against a real Triton (started by `cnclip
    triton-server`) and against `cnclip serve`'s /v2: the same vectors as the in-process encoder from both."""
    example = documented_tritonclient_example()
    # Only the address and the photo are swapped for this test's; the rest runs as printed.
    assert example.count('"127.0.0.1:8000"') == 1 and example.count('"photo.jpg"') == 1, example
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(image_file((200, 30, 30), fmt="JPEG"))
    url = request.getfixturevalue(server).url
    code = example.replace('"127.0.0.1:8000"', repr(url)).replace('"photo.jpg"', repr(str(photo)))
    names: dict[str, Any] = {}
    exec(compile(code, str(TRITON_PAGE), "exec"), names)  # noqa: S102 - the docs' own code, nothing from outside

    local = ours.app.state.encoder
    expected_text = ours.call(local.embed_token_ids(tokenize(["穿红色裙子的女孩"])))
    expected_image = ours.call(local.embed_images([photo.read_bytes()]))
    assert names["vector"].shape == (1, 32) and names["image_vector"].shape == (1, 32)
    assert cosines(names["vector"], expected_text).min() >= 0.99999
    assert cosines(names["image_vector"], expected_image).min() >= 0.99999


def test_triton_refuses_more_than_max_batch_size(triton: RealTriton) -> None:
    with pytest.raises(InferenceServerException) as err:
        infer(triton.url, "cnclip_text", "text", "INT64", tokenize(["太多"] * 17))
    assert err.value.status() == "400" and "batch-size must be <= 16" in err.value.message()


# --- golden tests: the same calls to Triton and to our /v2 ------------------------------------------

# Keys whose values are maps with free keys: compared by the structure of their values only.
FREE_MAPS = {"parameters", "cc_model_filenames", "metric_tags", "input_map", "output_map", "response_stats"}


def structure(value: Any, key: str | None = None) -> Any:
    """What is compared: keys and value types, recursively; list items as a set of structures."""
    if isinstance(value, dict):
        if key in FREE_MAPS:
            return ("map", sorted({json.dumps(structure(v), sort_keys=True) for v in value.values()}))
        return {k: structure(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return ("list", sorted({json.dumps(structure(v, key), sort_keys=True) for v in value}))
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def text_body(rows: int = 1, **extra: Any) -> dict[str, Any]:
    ids = tokenize(["你好"] * rows)
    return {"inputs": [{"name": "text", "shape": [rows, 52], "datatype": "INT64", "data": ids.tolist()}], **extra}


def binary_request(name: str, datatype: str, array: np.ndarray, model_output: str) -> tuple[bytes, dict[str, str]]:
    """A request as tritonclient sends it with binary tensors."""
    tensor = triton_http.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=True)
    output = triton_http.InferRequestedOutput(model_output, binary_data=True)
    body, json_size = triton_http.InferenceServerClient.generate_request_body([tensor], outputs=[output])
    return body, {"Inference-Header-Content-Length": str(json_size)}


def _binary_header(response: httpx.Response) -> Any:
    size = int(response.headers["Inference-Header-Content-Length"])
    return json.loads(response.content[:size])


@dataclass
class Call:
    method: str
    path: str
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    pick: Callable[[Any], Any] | None = None  # the part of the body to compare
    # Where we answer differently on purpose: the status we give (Triton's is in the comment).
    our_status: int | None = None

    def send(self, base: str) -> httpx.Response:
        headers = {"Accept-Encoding": "identity", **self.headers}
        return httpx.request(
            self.method, base + self.path, json=self.json, content=self.content, headers=headers, timeout=60
        )


def _image_bytes_request() -> tuple[bytes, dict[str, str]]:
    files = np.array([[image_file((200, 10, 10))], [image_file((10, 10, 200), fmt="JPEG")]], dtype=np.object_)
    return binary_request("image_bytes", "BYTES", files, "image_features")


def _pixels_request() -> tuple[bytes, dict[str, str]]:
    pixels = preprocess_image(image_file((30, 150, 30)))[None]
    return binary_request("image", "FP32", pixels, "image_features")


def _calls() -> list[Call]:
    text_json = json.dumps(text_body(2, id="7")).encode()
    text_binary, text_binary_headers = binary_request("text", "INT64", tokenize(["二进制", "张量"]), "text_features")
    image_bytes, image_bytes_headers = _image_bytes_request()
    pixels, pixels_headers = _pixels_request()
    bad_image, bad_image_headers = binary_request(
        "image_bytes", "BYTES", np.array([[b"<html>not an image</html>"]], dtype=np.object_), "image_features"
    )
    no_params = lambda body: {k: v for k, v in body.items() if k != "parameters"}  # noqa: E731
    first_model = lambda body: [m for m in body["model_stats"] if m["name"] == "cnclip_text"]  # noqa: E731
    core = lambda body: {k: body[k] for k in ("name", "max_batch_size", "input", "output", "version_policy")}  # noqa: E731
    return [
        # inference first, so that the statistics below have something to count on both servers
        Call("POST", "/v2/models/cnclip_text/infer", content=text_json, headers={"Content-Type": "application/json"}),
        Call("POST", "/v2/models/cnclip_text/infer", content=text_binary, headers=text_binary_headers, pick=None),
        # Triton's ensembles add top-level response `parameters` (sequence flags); its towers do not.
        Call(
            "POST",
            "/v2/models/cnclip_image_bytes/infer",
            content=image_bytes,
            headers=image_bytes_headers,
            pick=no_params,
        ),
        Call("POST", "/v2/models/cnclip_image/infer", content=pixels, headers=pixels_headers),
        Call(
            "POST",
            "/v2/models/cnclip_text/infer",
            content=gzip.compress(text_json),
            headers={"Content-Encoding": "gzip"},
        ),
        Call(
            "POST",
            "/v2/models/cnclip_text/infer",
            content=zlib.compress(text_json),
            headers={"Content-Encoding": "deflate"},
        ),
        # Triton answers 501 to a coding it lacks and 503 to load/unload without model control; a refusal
        # for good of the client's request is a 4xx here (415, 403), so no hostile request earns a 5xx.
        Call(
            "POST",
            "/v2/models/cnclip_text/infer",
            content=text_json,
            headers={"Content-Encoding": "br"},
            our_status=415,
        ),
        Call("POST", "/v2/models/cnclip_text/infer", json=text_body(), headers={"Accept-Encoding": "gzip"}),
        Call("POST", "/v2/models/cnclip_text/infer", json=text_body(), headers={"Accept-Encoding": "deflate"}),
        Call("POST", "/v2/models/nope/infer", json=text_body()),
        Call("POST", "/v2/models/cnclip_text/versions/7/infer", json=text_body()),
        Call("POST", "/v2/models/cnclip_text/infer", json={"inputs": [{**text_body()["inputs"][0], "shape": [2, 26]}]}),
        Call(
            "POST", "/v2/models/cnclip_text/infer", json={"inputs": [{**text_body()["inputs"][0], "datatype": "INT32"}]}
        ),
        Call("POST", "/v2/models/cnclip_text/infer", json={"inputs": [{**text_body()["inputs"][0], "name": "ids"}]}),
        Call("POST", "/v2/models/cnclip_text/infer", json=text_body(300)),  # over max_batch_size (16 / 256)
        Call("POST", "/v2/models/cnclip_image_bytes/infer", content=bad_image, headers=bad_image_headers),
        # Triton 2.51 answers 500 to a body that is not JSON; a client's mistake is a 400 here.
        Call("POST", "/v2/models/cnclip_text/infer", content=b"{not json", our_status=400),
        # server, health, metadata, configuration, statistics, repository
        Call("GET", "/v2", pick=lambda body: {k: body[k] for k in ("name", "version", "extensions")}),
        Call("GET", "/v2/health/live"),
        Call("GET", "/v2/health/ready"),
        Call("GET", "/v2/models/cnclip_text"),
        Call("GET", "/v2/models/cnclip_image"),
        Call("GET", "/v2/models/cnclip_image_bytes"),
        Call("GET", "/v2/models/cnclip_text/versions/1"),
        Call("GET", "/v2/models/cnclip_text/versions/7"),
        Call("GET", "/v2/models/nope"),
        Call("GET", "/v2/models/cnclip_text/ready"),
        Call("GET", "/v2/models/cnclip_image_bytes/versions/1/ready"),
        Call("GET", "/v2/models/nope/ready"),
        Call("GET", "/v2/models/cnclip_text/config"),
        Call("GET", "/v2/models/cnclip_image/versions/1/config"),
        Call("GET", "/v2/models/cnclip_image_bytes/config", pick=core),  # Triton's is an ensemble
        Call("GET", "/v2/models/nope/config"),
        Call("GET", "/v2/models/cnclip_text/stats"),
        Call("GET", "/v2/models/cnclip_image/versions/1/stats"),
        Call("GET", "/v2/models/stats", pick=first_model),
        Call("GET", "/v2/models/nope/stats"),
        Call("GET", "/v2/models/cnclip_text/versions/7/stats"),
        Call("POST", "/v2/repository/index", json={}),
        Call("POST", "/v2/repository/index", json={"ready": True}),
        Call("POST", "/v2/repository/index"),
        Call("POST", "/v2/repository/models/cnclip_text/load", our_status=403),
        Call("POST", "/v2/repository/models/cnclip_text/unload", our_status=403),
        # routes and methods that do not exist
        Call("GET", "/v2/repository/index"),
        Call("GET", "/v2/nothing"),
        Call("GET", "/v2/models/cnclip_text/nothing"),
        Call("GET", "/v2/models/cnclip_text/infer"),
        Call("DELETE", "/v2/models/cnclip_text"),
        Call("PUT", "/v2"),
        Call("POST", "/v2/health/ready"),
    ]


def _answer(call: Call, response: httpx.Response) -> tuple[Any, ...]:
    """Status, the headers that carry meaning, and the body's structure."""
    media = response.headers.get("content-type", "").split(";")[0]
    if "inference-header-content-length" in response.headers:
        body: Any = _binary_header(response)
    elif not response.content:
        body = None
    else:
        body = response.json()
    if call.pick is not None and response.status_code == 200:
        body = call.pick(body)
    encoding = response.headers.get("content-encoding")
    has_binary = "inference-header-content-length" in response.headers
    return response.status_code, media if response.status_code == 200 else None, encoding, has_binary, structure(body)


def test_golden_same_calls_same_structure(triton: RealTriton, ours: ServerThread) -> None:
    differences = []
    for call in _calls():
        theirs = _answer(call, call.send(f"http://{triton.url}"))
        mine = _answer(call, call.send(f"http://{ours.url}"))
        if call.our_status is not None:
            assert mine[0] == call.our_status, f"{call.method} {call.path}: {mine[0]}"
            theirs, mine = theirs[1:], mine[1:]
        if theirs != mine:
            differences.append(f"{call.method} {call.path} {call.headers}:\n  triton {theirs}\n  ours   {mine}")
    assert not differences, "\n".join(differences)


def test_our_config_is_the_exported_config(ours: ServerThread, python_repo: Path) -> None:
    """GET /config names the same tensors, types and dims as the config.pbtxt `export-triton` writes."""
    client = triton_http.InferenceServerClient(ours.url)
    try:
        for name in MODELS:
            served = client.get_model_config(name)
            exported = json_format.MessageToDict(
                parse_config(python_repo / name / "config.pbtxt"), preserving_proto_field_name=True
            )
            for key in ("input", "output"):
                assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in served[key]] == [
                    (t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in exported[key]
                ], name
            assert served["max_batch_size"] > 0 and int(exported["max_batch_size"]) > 0
            # What our server runs: the encoder's buckets as preferred batch sizes, its provider and precision.
            assert served["dynamic_batching"]["preferred_batch_size"] == [1, 4, 8]
            assert served["parameters"]["precision"] == {"string_value": "fp32"}
            assert served["parameters"]["provider"] == {"string_value": "cpu"}
    finally:
        client.close()


@pytest.mark.parametrize("server", ["triton", "ours"])
def test_tritonclient_uses_the_whole_protocol(request: pytest.FixtureRequest, server: str) -> None:
    """What a tritonclient user (and perf_analyzer) calls works the same against both servers."""
    url = request.getfixturevalue(server).url
    ids = tokenize(["压缩", "统计"])
    client = triton_http.InferenceServerClient(url)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.get_model_config("cnclip_text")["input"][0]["dims"] == [52]
        assert {m["name"] for m in client.get_model_repository_index()} >= set(MODELS)
        before = client.get_inference_statistics("cnclip_text")["model_stats"][0]
        plain = infer(url, "cnclip_text", "text", "INT64", ids)
        for request_compression, response_compression in (("gzip", "deflate"), ("deflate", "gzip")):
            squeezed = infer(
                url,
                "cnclip_text",
                "text",
                "INT64",
                ids,
                request_compression_algorithm=request_compression,
                response_compression_algorithm=response_compression,
            )
            np.testing.assert_array_equal(squeezed, plain)
        after = client.get_inference_statistics("cnclip_text")["model_stats"][0]
        assert after["inference_count"] - before["inference_count"] == 6
        success = after["inference_stats"]["success"]
        assert success["count"] - before["inference_stats"]["success"]["count"] == 3 and success["ns"] > 0
        assert after["last_inference"] > 0
        assert {b["batch_size"] for b in after["batch_stats"]} >= {2}
        # Errors come back as InferenceServerException with the server's message, never a TypeError.
        for call in (lambda: client.get_model_config("nope"), lambda: client.get_model_metadata("nope")):
            with pytest.raises(InferenceServerException) as err:
                call()
            assert err.value.status() == "404" and "nope" in err.value.message()
        with pytest.raises(InferenceServerException) as err:
            client.get_inference_statistics("nope")
        assert err.value.status() == "400"
    finally:
        client.close()
