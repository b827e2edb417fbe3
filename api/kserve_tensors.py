"""The tensors of the KServe v2 / Triton HTTP protocol as api/kserve.py serves them: the models and
their input contracts, request bodies (JSON or the binary tensor data extension, gzip/deflate),
decoding inputs for the encoder and encoding its answers."""

from __future__ import annotations

import base64
import json
import math
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from api.body_budget import BodyBudget, read_within
from api.values import ascii_count, numbers_within
from retrieval.errors import InvalidInput, PayloadTooLarge

HEADER_LENGTH = "Inference-Header-Content-Length"
MODEL_VERSION = "1"
MAX_BATCH = 256  # items per request (the config's max_batch_size); the batcher splits them into buckets
MAX_BODY_BYTES = 64 * 1024 * 1024  # after decompression
# JSON `data` is parsed into Python objects while holding the GIL (~0.1 s per million numbers here), so
# a JSON tensor is capped at about three 224 px FP32 images; larger batches use the binary extension.
MAX_JSON_TENSOR_VALUES = 1 << 19
HEADER_JSON_VALUES = 1024  # the request's own keys, parameters and outputs around the tensor's data
CONTROL_BODY_BYTES = 64 * 1024  # repository index and other small control requests
CONTROL_JSON_VALUES = 1024
# cn_clip's vocab.txt has 21128 entries; ids outside it would make the embedding Gather fail inside ONNX Runtime.
VOCAB_SIZE = 21128

_NUMPY_DTYPES: dict[str, np.dtype[Any]] = {"INT64": np.dtype("<i8"), "FP32": np.dtype("<f4")}
# What JSON `data` may hold, checked before conversion: token ids of the vocabulary; finite FP32 values.
_FP32_MAX = float(np.finfo(np.float32).max)
_JSON_RANGES: dict[str, tuple[float, float]] = {"INT64": (0, VOCAB_SIZE - 1), "FP32": (-_FP32_MAX, _FP32_MAX)}


@dataclass(frozen=True)
class ServedModel:
    name: str
    input_name: str
    datatype: str  # of the input; every output is FP32
    output_name: str
    tower: str

    def input_dims(self, encoder: Any) -> list[int]:
        """The input shape after the batch dimension."""
        if self.datatype == "INT64":
            return [int(encoder.context_length)]
        if self.datatype == "FP32":
            return [3, int(encoder.image_size), int(encoder.image_size)]
        return [1]  # one file per row, as Triton's batching ensemble takes it


MODELS = {
    m.name: m
    for m in (
        ServedModel("cnclip_text", "text", "INT64", "text_features", "text"),
        ServedModel("cnclip_image", "image", "FP32", "image_features", "image"),
        ServedModel("cnclip_image_bytes", "image_bytes", "BYTES", "image_features", "image"),
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


# --- request and response bodies ----------------------------------------------------------------------


def header_length(request: Request) -> int | None:
    """`Inference-Header-Content-Length`: the JSON header's bytes before the binary tensor data (None: all JSON)."""
    value = request.headers.get(HEADER_LENGTH)
    if value is None:
        return None
    length = ascii_count(value)  # the request number rule (api/values.py)
    if length is None or len(value) > 12:
        raise BadRequest(f"{HEADER_LENGTH} is '{value[:20]}', not a byte count")
    return length


def body_budget(model: ServedModel | None, encoder: Any, json_bytes: int | None = None) -> BodyBudget:
    """What a request body may cost: an inference request to `model` (its largest legal batch as JSON),
    or (`model` None) a small control request such as the repository index."""
    if model is None:
        return BodyBudget(CONTROL_BODY_BYTES, CONTROL_JSON_VALUES)
    # Twice the largest legal batch: a request somewhat over the batch limit still gets the protocol's own
    # 400 from the batch check, as Triton answers it (tests/system/test_real_triton.py's golden calls); only a
    # body far past any legal request is a 413 before it is parsed.
    elements = 2 * MAX_BATCH * math.prod(model.input_dims(encoder))
    # A row list per item and the header's own keys (inputs, outputs, parameters...) on top of the elements.
    values = min(elements, MAX_JSON_TENSOR_VALUES) + 2 * MAX_BATCH + HEADER_JSON_VALUES
    return BodyBudget(MAX_BODY_BYTES, values, json_bytes)


async def read_body(request: Request, budget: BodyBudget) -> bytes:
    """The request body, decompressed when it came with `Content-Encoding: gzip` or `deflate`, refused
    (413) as soon as it goes over `budget` (see api/body_budget.py)."""
    declared = request.headers.get("content-length")
    length = ascii_count(declared) if declared is not None else None
    if length is not None and length > budget.max_bytes:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {budget.max_bytes:,}")
    return await read_within(request.stream(), budget, request.headers.get("content-encoding"))


def accepted(request: Request) -> str | None:
    """The response compression the client accepts (`Accept-Encoding`), gzip or deflate, in its order."""
    for part in request.headers.get("accept-encoding", "").split(","):
        name, _, params = part.strip().lower().partition(";")
        if name in ("gzip", "deflate") and params.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000"):
            return name
    return None


def split_body(body: bytes, header_length: int | None) -> tuple[InferRequest, bytes]:
    """The JSON header and the binary tensor data that follows it (empty for pure JSON). Blocking
    (parsing): call it in a worker thread, on a body `read_body` has kept within its budget."""
    if header_length is None:
        json_part, binary = body, b""
    else:
        if header_length > len(body):
            raise BadRequest(f"{HEADER_LENGTH} is '{header_length}' but the body has {len(body)} bytes")
        json_part, binary = body[:header_length], body[header_length:]
    try:
        return InferRequest.model_validate_json(json_part), binary
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise BadRequest(f"malformed inference request: {where}: {first.get('msg')}".replace(": :", ":")) from None


def decode_input(model: ServedModel, req: InferRequest, binary: bytes, encoder: Any) -> Any:
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
        array = _json_tensor(tensor, model.datatype, shape, count)
    if model.datatype == "INT64" and array.size and (array.min() < 0 or array.max() >= VOCAB_SIZE):
        raise BadRequest(f"token ids must lie in [0, {VOCAB_SIZE}); got {array.min()}..{array.max()}")
    if model.datatype == "FP32" and not np.isfinite(array).all():
        raise BadRequest(f"input '{tensor.name}' contains NaN or infinity")
    return np.ascontiguousarray(array)


def _json_tensor(tensor: RequestInput, datatype: str, shape: list[int], count: int) -> np.ndarray:
    """JSON `data` as an array of `shape`, every value checked against the datatype's range.

    A regular nested list of ints or floats, all finite, is read by numpy in one call (issue 34: the
    element-by-element path made the JSON tensor path 0.68× the binary one). Anything else — bools,
    strings, null, ragged rows, ints past 64 bits, NaN or infinity — goes element by element, so its
    answer (and error message) is the same as before."""
    low, high = _JSON_RANGES[datatype]
    out_of_range = f"input '{tensor.name}' holds values that are not {datatype} numbers in [{low:g}, {high:g}]"
    data = tensor.data if tensor.data is not None else []
    numeric = _regular_numbers(data)
    if numeric is not None:
        if numeric.size != count:
            raise BadRequest(f"input '{tensor.name}' has {numeric.size} elements, its shape {shape} needs {count}")
        if numeric.size and not (low <= numeric.min() and numeric.max() <= high):
            raise BadRequest(out_of_range)
        if datatype == "FP32" and numeric.dtype.kind in "iu":
            numeric = numeric.astype(np.float64)  # as Python converts an int: to a double, then to float32
        return numeric.astype(_NUMPY_DTYPES[datatype]).reshape(shape)
    flat = _flatten(data)
    if len(flat) != count:
        raise BadRequest(f"input '{tensor.name}' has {len(flat)} elements, its shape {shape} needs {count}")
    # Bounded before numpy converts them (2**70 or 10**400 would raise OverflowError there).
    if not numbers_within(flat, low, high):
        raise BadRequest(out_of_range)
    try:
        return np.asarray(flat, dtype=_NUMPY_DTYPES[datatype]).reshape(shape)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"input '{tensor.name}' holds values that are not {datatype}") from exc


def _regular_numbers(data: list[Any]) -> np.ndarray | None:
    """`data` as an int64/uint64/float64 array when it is a regular nesting of finite numbers; else None."""
    try:
        array = np.array(data)
    except (ValueError, TypeError, OverflowError, RecursionError):  # ragged, or ints past float range
        return None
    if array.dtype.kind not in "iuf" or (array.dtype.kind == "f" and not np.isfinite(array).all()):
        return None
    return array


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
        except ValueError as exc:  # binascii.Error, or a plain ValueError for a non-ASCII string
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


def wants_binary_output(model: ServedModel, req: InferRequest) -> bool:
    default = bool((req.parameters or {}).get("binary_data_output", False))
    if not req.outputs:
        return default
    for output in req.outputs:
        if output.name != model.output_name:
            raise BadRequest(f"model '{model.name}' has no output '{output.name}' (it has '{model.output_name}')")
    return bool((req.outputs[0].parameters or {}).get("binary_data", default))


def encode_response(
    model: ServedModel, req: InferRequest, features: np.ndarray, binary: bool, compression: str | None = None
) -> Response:
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
    headers: dict[str, str] = {}
    if binary:
        headers[HEADER_LENGTH] = str(len(header))  # of the uncompressed JSON, as Triton sends it
    content = header + raw
    if compression == "gzip":
        compressor = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16)
        content = compressor.compress(content) + compressor.flush()
        headers["Content-Encoding"] = "gzip"
    elif compression == "deflate":
        content = zlib.compress(content, 6)
        headers["Content-Encoding"] = "deflate"
    media_type = "application/octet-stream" if binary else "application/json"
    return Response(content, media_type=media_type, headers=headers)
