"""KServe v2 / Triton HTTP protocol for our encoders, so Triton clients and tools can use this server.

Three models, all served by the app's encoder (`request.app.state.encoder`) and therefore by the
same dynamic batcher as the REST API:

| model                | input                                  | output                              |
| -------------------- | -------------------------------------- | ----------------------------------- |
| `cnclip_text`        | `text`  INT64 `[-1, 52]` token ids     | `text_features`  FP32 `[-1, d]`     |
| `cnclip_image`       | `image` FP32 `[-1, 3, R, R]` normalised | `image_features` FP32 `[-1, d]`     |
| `cnclip_image_bytes` | `image_bytes` BYTES `[-1]` JPEG/PNG/…  | `image_features` FP32 `[-1, d]`     |

Tensors travel as JSON (`data`) or with the binary tensor data extension (the JSON header's length
in `Inference-Header-Content-Length`, raw little-endian bytes after it; BYTES elements as 4-byte
length + bytes). JSON cannot carry raw image bytes, so `cnclip_image_bytes` reads JSON string
elements as base64. Errors use the v2 shape `{"error": "<message>"}`.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from api.deps import require_read_key
from api.errors import http_status, public_message, retry_headers
from retrieval.errors import CnclipError, InvalidInput, NotFound, PayloadTooLarge

HEADER_LENGTH = "Inference-Header-Content-Length"
MODEL_VERSION = "1"
MAX_BATCH = 256  # items per request; the batcher splits them into buckets
MAX_BODY_BYTES = 64 * 1024 * 1024
# cn_clip's vocab.txt has 21128 entries; ids outside it would make the embedding Gather fail inside ONNX Runtime.
VOCAB_SIZE = 21128

_NUMPY_DTYPES: dict[str, np.dtype[Any]] = {"INT64": np.dtype("<i8"), "FP32": np.dtype("<f4")}


@dataclass(frozen=True)
class ServedModel:
    name: str
    input_name: str
    datatype: str  # of the input; every output is FP32
    output_name: str

    def input_dims(self, encoder: Any) -> list[int]:
        """The input shape after the batch dimension."""
        if self.datatype == "INT64":
            return [int(encoder.context_length)]
        if self.datatype == "FP32":
            return [3, int(encoder.image_size), int(encoder.image_size)]
        return []


MODELS = {
    m.name: m
    for m in (
        ServedModel("cnclip_text", "text", "INT64", "text_features"),
        ServedModel("cnclip_image", "image", "FP32", "image_features"),
        ServedModel("cnclip_image_bytes", "image_bytes", "BYTES", "image_features"),
    )
}


class RequestInput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class RequestOutput(BaseModel):
    name: str
    parameters: dict[str, Any] | None = None


class InferRequest(BaseModel):
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


class BadRequest(InvalidInput):
    """A request that breaks the v2 protocol or a model's input contract (400, like every InvalidInput here)."""

    code = "bad_request"


router = APIRouter(prefix="/v2", tags=["kserve-v2"])


def v2_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The v2 protocol's error body."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _error_response(exc: CnclipError) -> JSONResponse:
    # Triton answers 400 for every input it cannot use (including undecodable images); keep 413/429/5xx.
    status = 400 if isinstance(exc, InvalidInput) and not isinstance(exc, PayloadTooLarge) else http_status(exc)
    # A 500 is a bug whose text may hold paths and library messages; a 503's says which remote is down,
    # which the operator of a chained encoder needs.
    message = public_message(status, exc.message) if status == 500 else exc.message
    return v2_error(status, message, retry_headers(exc))


def _served(name: str, version: str | None) -> ServedModel:
    if version not in (None, "", MODEL_VERSION):
        raise NotFound(f"model '{name}' has no version '{version}' (only '{MODEL_VERSION}')")
    if name not in MODELS:
        raise NotFound(f"unknown model '{name}'; this server has {', '.join(MODELS)}")
    return MODELS[name]


def _encoder(request: Request) -> Any:
    return getattr(request.app.state, "encoder", None)


def _is_ready(request: Request) -> bool:
    encoder = _encoder(request)
    return encoder is not None and bool(encoder.ready)


@router.get("")
async def server_metadata() -> dict[str, Any]:
    """Server name, version and the protocol extensions it speaks."""
    try:
        version = dist_version("cnclip-search")
    except PackageNotFoundError:  # running from a source tree that was never installed
        version = "0"
    return {"name": "cnclip", "version": version, "extensions": ["binary_tensor_data"]}


# Health answers carry the KServe v2 REST bodies ({"live": bool}, {"ready": bool}); Triton itself sends
# an empty body, and its clients (tritonclient's is_server_live/ready) read only the status.
@router.get("/health/live")
async def live() -> JSONResponse:
    """200 `{"live": true}` while the process serves HTTP."""
    return JSONResponse({"live": True})


@router.get("/health/ready")
async def ready(request: Request) -> JSONResponse:
    """200 `{"ready": true}` once the encoder has warmed every bucket, 503 `{"ready": false}` before."""
    is_ready = _is_ready(request)
    return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)


@router.get("/models/{name}")
@router.get("/models/{name}/versions/{version}")
async def model_metadata(request: Request, name: str, version: str | None = None) -> Response:
    """Inputs and outputs of a model, with -1 for the batch dimension."""
    try:
        model = _served(name, version)
        await require_read_key(request)
    except CnclipError as exc:
        return _error_response(exc)
    encoder = _encoder(request)
    if encoder is None:
        return v2_error(503, "no encoder is configured on this server")
    input_shape = [-1, *model.input_dims(encoder)]
    return JSONResponse(
        {
            "name": model.name,
            "versions": [MODEL_VERSION],
            "platform": "cnclip",
            "inputs": [{"name": model.input_name, "datatype": model.datatype, "shape": input_shape}],
            "outputs": [{"name": model.output_name, "datatype": "FP32", "shape": [-1, int(encoder.dim)]}],
        }
    )


@router.get("/models/{name}/ready")
@router.get("/models/{name}/versions/{version}/ready")
async def model_ready(request: Request, name: str, version: str | None = None) -> Response:
    """200 when the model can serve, 503 while the encoder warms up, 404 for an unknown model."""
    try:
        model = _served(name, version)
    except CnclipError as exc:
        return _error_response(exc)
    is_ready = _is_ready(request)
    return JSONResponse({"name": model.name, "ready": is_ready}, status_code=200 if is_ready else 503)


@router.post("/models/{name}/infer")
@router.post("/models/{name}/versions/{version}/infer")
async def infer(request: Request, name: str, version: str | None = None) -> Response:
    """Run one inference request (JSON or binary tensors) through the encoder's batcher."""
    try:
        model = _served(name, version)
        # Inference is a read: it needs the API key only when reads do. Health stays open for load balancers.
        await require_read_key(request)
        encoder = _encoder(request)
        if encoder is None or not encoder.ready:
            return v2_error(503, f"model '{name}' is not ready")
        body = await _read_body(request)
        infer_request, binary = _split_body(body, request.headers.get(HEADER_LENGTH))
        batch = _decode_input(model, infer_request, binary, encoder)
        binary_output = _wants_binary_output(model, infer_request)
        if model.datatype == "INT64":
            features = await encoder.embed_token_ids(batch)
        elif model.datatype == "FP32":
            features = await encoder.embed_pixels(batch)
        else:
            features = await encoder.embed_images(batch)
    except CnclipError as exc:
        return _error_response(exc)
    return _encode_response(model, infer_request, np.asarray(features, dtype=np.float32), binary_output)


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {MAX_BODY_BYTES}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise PayloadTooLarge(f"request body exceeds the limit of {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _split_body(body: bytes, header_length: str | None) -> tuple[InferRequest, bytes]:
    """The JSON header and the binary tensor data that follows it (empty for pure JSON)."""
    if header_length is None:
        json_part, binary = body, b""
    else:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise BadRequest(f"{HEADER_LENGTH} is '{header_length}' but the body has {len(body)} bytes")
        json_part, binary = body[: int(header_length)], body[int(header_length) :]
    try:
        return InferRequest.model_validate_json(json_part), binary
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise BadRequest(f"malformed inference request: {where}: {first.get('msg')}".replace(": :", ":")) from None


def _decode_input(model: ServedModel, req: InferRequest, binary: bytes, encoder: Any) -> Any:
    """Check the one input against the model and return it as the encoder takes it."""
    if len(req.inputs) != 1 or req.inputs[0].name != model.input_name:
        names = [i.name for i in req.inputs]
        raise BadRequest(f"model '{model.name}' takes exactly one input '{model.input_name}', got {names}")
    tensor = req.inputs[0]
    if tensor.datatype != model.datatype:
        raise BadRequest(
            f"input '{tensor.name}' must be {model.datatype}, got {tensor.datatype} (model '{model.name}')"
        )
    shape = tensor.shape
    dims = model.input_dims(encoder)
    bytes_shapes_ok = model.datatype == "BYTES" and len(shape) in (1, 2) and shape[1:] in ([], [1])
    if not (bytes_shapes_ok or (len(shape) == 1 + len(dims) and shape[1:] == dims)) or any(s < 0 for s in shape):
        raise BadRequest(f"input '{tensor.name}' has shape {shape}; model '{model.name}' expects {[-1, *dims]}")
    n = shape[0]
    if not 1 <= n <= MAX_BATCH:
        raise BadRequest(f"batch of {n} items; this server takes 1 to {MAX_BATCH} per request")
    count = math.prod(shape)
    segment = _binary_segment(tensor, binary)
    if model.datatype == "BYTES":
        items = _deserialize_bytes(segment) if segment is not None else _base64_items(tensor.data)
        if len(items) != count:
            raise BadRequest(f"input '{tensor.name}' has {len(items)} elements, its shape {shape} needs {count}")
        return items
    dtype = _NUMPY_DTYPES[model.datatype]
    if segment is not None:
        if len(segment) != count * dtype.itemsize:
            raise BadRequest(
                f"input '{tensor.name}' has {len(segment)} bytes of binary data; shape {shape} of "
                f"{model.datatype} needs {count * dtype.itemsize}"
            )
        array = np.frombuffer(segment, dtype=dtype).reshape(shape)
    else:
        flat = _flatten(tensor.data if tensor.data is not None else [])
        if len(flat) != count:
            raise BadRequest(f"input '{tensor.name}' has {len(flat)} elements, its shape {shape} needs {count}")
        try:
            array = np.asarray(flat, dtype=dtype).reshape(shape)
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"input '{tensor.name}' holds values that are not {model.datatype}") from exc
    if model.datatype == "INT64" and array.size and (array.min() < 0 or array.max() >= VOCAB_SIZE):
        raise BadRequest(f"token ids must lie in [0, {VOCAB_SIZE}); got {array.min()}..{array.max()}")
    if model.datatype == "FP32" and not np.isfinite(array).all():
        raise BadRequest(f"input '{tensor.name}' contains NaN or infinity")
    return np.ascontiguousarray(array)


def _binary_segment(tensor: RequestInput, binary: bytes) -> bytes | None:
    """The input's slice of the binary section, or None when it came as JSON `data`."""
    size = (tensor.parameters or {}).get("binary_data_size")
    if size is None:
        if tensor.data is None:
            raise BadRequest(f"input '{tensor.name}' has neither 'data' nor 'binary_data_size'")
        return None
    if not isinstance(size, int) or size < 0 or size != len(binary):
        # One input per model, so its binary data is the whole binary section.
        raise BadRequest(f"input '{tensor.name}' declares {size} bytes of binary data, the body carries {len(binary)}")
    return binary


def _deserialize_bytes(buffer: bytes) -> list[bytes]:
    """Triton's BYTES serialisation: each element is a little-endian uint32 length then its bytes."""
    items, offset = [], 0
    while offset < len(buffer):
        if offset + 4 > len(buffer):
            raise BadRequest("BYTES tensor data is truncated inside an element length")
        (length,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        if offset + length > len(buffer):
            raise BadRequest("BYTES tensor data is truncated inside an element")
        items.append(buffer[offset : offset + length])
        offset += length
    return items


def _base64_items(data: list[Any] | None) -> list[bytes]:
    items = []
    for value in _flatten(data or []):
        if not isinstance(value, str):
            raise BadRequest("JSON elements of a BYTES input must be base64 strings of the image files")
        try:
            items.append(base64.b64decode(value, validate=True))
        except binascii.Error as exc:
            raise BadRequest("a JSON element of the BYTES input is not valid base64") from exc
    return items


def _flatten(data: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for value in data:
        if isinstance(value, list):
            out.extend(_flatten(value))
        else:
            out.append(value)
    return out


def _wants_binary_output(model: ServedModel, req: InferRequest) -> bool:
    default = bool((req.parameters or {}).get("binary_data_output", False))
    if not req.outputs:
        return default
    for output in req.outputs:
        if output.name != model.output_name:
            raise BadRequest(f"model '{model.name}' has no output '{output.name}' (it has '{model.output_name}')")
    return bool((req.outputs[0].parameters or {}).get("binary_data", default))


def _encode_response(model: ServedModel, req: InferRequest, features: np.ndarray, binary: bool) -> Response:
    output: dict[str, Any] = {"name": model.output_name, "datatype": "FP32", "shape": list(features.shape)}
    raw = b""
    if binary:
        raw = features.astype("<f4", copy=False).tobytes()
        output["parameters"] = {"binary_data_size": len(raw)}
    else:
        output["data"] = features.ravel().tolist()
    body: dict[str, Any] = {"model_name": model.name, "model_version": MODEL_VERSION, "outputs": [output]}
    if req.id is not None:
        body["id"] = req.id
    header = json.dumps(body, separators=(",", ":")).encode()
    if not binary:
        return Response(header, media_type="application/json")
    return Response(header + raw, media_type="application/octet-stream", headers={HEADER_LENGTH: str(len(header))})
