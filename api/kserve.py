"""KServe v2 / Triton HTTP protocol for our encoders, so Triton clients and tools can use this server.

Three models, all served by the app's encoder (`request.app.state.encoder`) and therefore by the
same dynamic batcher as the REST API:

| model                | input                                  | output                              |
| -------------------- | -------------------------------------- | ----------------------------------- |
| `cnclip_text`        | `text`  INT64 `[-1, 52]` token ids     | `text_features`  FP32 `[-1, d]`     |
| `cnclip_image`       | `image` FP32 `[-1, 3, R, R]` normalised | `image_features` FP32 `[-1, d]`     |
| `cnclip_image_bytes` | `image_bytes` BYTES `[-1, 1]` JPEG/PNG/… | `image_features` FP32 `[-1, d]`   |

Tensors travel as JSON (`data`) or with the binary tensor data extension (the JSON header's length
in `Inference-Header-Content-Length`, raw little-endian bytes after it; BYTES elements as 4-byte
length + bytes). JSON cannot carry raw image bytes, so `cnclip_image_bytes` reads JSON string
elements as base64. `image_bytes` also takes `[n]` (one file per row without the trailing 1).

The rest of Triton's HTTP protocol, as tritonclient and perf_analyzer use it, answers as a real
Triton 2.51 does (the golden tests compare the two): model configuration (`/config`, the JSON of
Triton's `ModelConfig`), `POST /v2/repository/index`, statistics (`/stats`), health routes (200, or
400 with an empty body when not ready), `Content-Encoding: gzip|deflate` request bodies and
`Accept-Encoding` on inference responses, and `{"error": "<message>"}` for every error under `/v2`,
unknown routes (404) and methods (405) included.
"""

from __future__ import annotations

import json
import time
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import Match

from api.blocking import run_blocking
from api.body_budget import INLINE_PARSE_BYTES
from api.deps import require_read_key
from api.disconnect import ClientGone, client_gone_response, while_connected
from api.errors import allowed_methods, http_status, public_message, retry_headers
from api.kserve_config import PLATFORM, model_config
from api.kserve_stats import model_stats_of
from api.kserve_tensors import (
    MODEL_VERSION,
    MODELS,
    BadRequest,
    InferRequest,
    ServedModel,
    accepted,
    body_budget,
    decode_input,
    encode_response,
    header_length,
    read_body,
    split_body,
    wants_binary_output,
)
from api.uploads import inspect_images
from api.values import json_safe
from retrieval.errors import CnclipError, InvalidInput, NotFound, PayloadTooLarge
from retrieval.json_text import loads

EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository", "statistics", "parameters"]


router = APIRouter(prefix="/v2", tags=["kserve-v2"])


def v2_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The v2 protocol's error body (a lone surrogate the message quotes is escaped: api/values.py)."""
    return JSONResponse({"error": json_safe(message)}, status_code=status, headers=headers)


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


# --- inference (first: the hot route is matched before the others are tried) ----------------------


@router.post("/models/{name}/infer")
@router.post("/models/{name}/versions/{version}/infer")
async def infer(request: Request) -> Response:
    """Run one inference request (JSON or binary tensors) through the encoder's batcher."""
    started = time.perf_counter_ns()
    # Path parameters read here rather than declared: FastAPI's per-parameter validation is a
    # measurable share of this, the hottest route's, cost per request.
    name, version = request.path_params["name"], request.path_params.get("version")
    try:
        model = _served(name, version)
    except CnclipError as exc:
        return _error_response(exc)
    stats = model_stats_of(request)[model.name]
    try:
        # Inference is a read: it needs the API key only when reads do. Health stays open for load balancers.
        await require_read_key(request)
        encoder = _encoder(request)
        if encoder is None or not encoder.ready:
            return v2_error(503, f"model '{name}' is not ready")
        json_bytes = header_length(request)
        body = await read_body(request, body_budget(model, encoder, json_bytes))
        # Parsing and decoding are bounded by the budget; a large body is still too slow for the event loop,
        # and a small one (a text query) is quicker than the hop to a worker thread.
        if len(body) <= INLINE_PARSE_BYTES:
            infer_request, batch = _parse_request(model, body, json_bytes, encoder)
        else:
            infer_request, batch = await run_blocking(_parse_request, model, body, json_bytes, encoder)
        binary_output = wants_binary_output(model, infer_request)
        decoded = time.perf_counter_ns()
        if model.datatype == "INT64":
            features = await encoder.embed_token_ids(batch)
        elif model.datatype == "FP32":
            features = await encoder.embed_pixels(batch)
        else:
            # Every image and all together within the pixel budgets, from their headers, before any decoding.
            await run_blocking(inspect_images, list(batch), request.app.state.settings)
            features = await while_connected(request, encoder.embed_images(batch))
        inferred = time.perf_counter_ns()
        response = encode_response(
            model, infer_request, np.asarray(features, dtype=np.float32), binary_output, accepted(request)
        )
    except CnclipError as exc:
        stats.add("fail", time.perf_counter_ns() - started)
        return _error_response(exc)
    except ClientGone:
        stats.add("fail", time.perf_counter_ns() - started)
        return client_gone_response()
    stats.success(len(batch), decoded - started, inferred - decoded, time.perf_counter_ns() - inferred)
    return response


def _parse_request(model: ServedModel, body: bytes, json_bytes: int | None, encoder: Any) -> tuple[InferRequest, Any]:
    infer_request, binary = split_body(body, json_bytes)
    return infer_request, decode_input(model, infer_request, binary, encoder)


# --- server and health --------------------------------------------------------------------------------


def _empty(status: int) -> Response:
    """Triton's health answers: no body, text/plain."""
    return Response(status_code=status, media_type="text/plain")


@router.get("")
async def server_metadata() -> dict[str, Any]:
    """Server name, version and the protocol extensions it speaks."""
    try:
        version = dist_version("cnclip-search")
    except PackageNotFoundError:  # running from a source tree that was never installed
        version = "0"
    return {"name": "cnclip", "version": version, "extensions": EXTENSIONS}


# Health answers carry the KServe v2 REST bodies ({"live": bool}, {"ready": bool}); Triton itself sends
# an empty body, and its clients (tritonclient's is_server_live/ready) read only the status.
@router.get("/health/live")
async def live() -> Response:
    """200 while the process serves HTTP."""
    return _empty(200)


@router.get("/health/ready")
async def ready(request: Request) -> Response:
    """200 once the encoder has warmed every bucket; before that 400, as Triton answers."""
    return _empty(200 if _is_ready(request) else 400)


# --- models -------------------------------------------------------------------------------------------


@router.get("/models/stats")
async def all_stats(request: Request) -> Response:
    """Statistics of every model."""
    try:
        await require_read_key(request)
    except CnclipError as exc:
        return _error_response(exc)
    stats = model_stats_of(request)
    return JSONResponse({"model_stats": [stats[name].to_json(name) for name in sorted(MODELS)]})


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
            "platform": PLATFORM,
            "inputs": [{"name": model.input_name, "datatype": model.datatype, "shape": input_shape}],
            "outputs": [{"name": model.output_name, "datatype": "FP32", "shape": [-1, int(encoder.dim)]}],
        }
    )


@router.get("/models/{name}/config")
@router.get("/models/{name}/versions/{version}/config")
async def model_configuration(request: Request, name: str, version: str | None = None) -> Response:
    """The model configuration (Triton's `ModelConfig` as JSON): what perf_analyzer and
    `tritonclient`'s `get_model_config` read."""
    try:
        model = _served(name, version)
        await require_read_key(request)
    except CnclipError as exc:
        return _error_response(exc)
    encoder = _encoder(request)
    if encoder is None:
        return v2_error(503, "no encoder is configured on this server")
    return JSONResponse(model_config(model, encoder, getattr(request.app.state, "settings", None)))


@router.get("/models/{name}/stats")
@router.get("/models/{name}/versions/{version}/stats")
async def model_stats(request: Request, name: str, version: str | None = None) -> Response:
    """Counts and cumulative nanoseconds per stage of one model (see `ModelStats`)."""
    try:
        await require_read_key(request)
        if name not in MODELS or version not in (None, "", MODEL_VERSION):
            # Triton answers 400 here, not 404.
            raise BadRequest(f"requested model '{name}' is not available")
    except CnclipError as exc:
        return _error_response(exc)
    return JSONResponse({"model_stats": [model_stats_of(request)[name].to_json(name)]})


@router.get("/models/{name}/ready")
@router.get("/models/{name}/versions/{version}/ready")
async def model_ready(request: Request, name: str, version: str | None = None) -> Response:
    """200 when the model can serve; 400 while the encoder warms up and for an unknown model (as Triton)."""
    known = name in MODELS and version in (None, "", MODEL_VERSION)
    if known and _is_ready(request):
        return _empty(200)
    reason = "is not ready" if known else "is not served here"
    return v2_error(400, f"model '{name}' version {version or MODEL_VERSION} {reason}")


@router.post("/repository/index")
async def repository_index(request: Request) -> Response:
    """The models and their state; `{"ready": true}` lists only the ready ones."""
    try:
        await require_read_key(request)
        body = await read_body(request, body_budget(None, None))
        options = loads(body) if body.strip() else {}  # at most 64 KiB: quick enough for the loop
        if not isinstance(options, dict):
            raise BadRequest("the repository index request must be a JSON object")
    except json.JSONDecodeError:
        return v2_error(400, "the repository index request is not valid JSON")
    except CnclipError as exc:
        return _error_response(exc)
    ready_now = _is_ready(request)
    if options.get("ready") and not ready_now:
        return JSONResponse([])
    entry: dict[str, Any] = {"version": MODEL_VERSION, "state": "READY" if ready_now else "UNAVAILABLE"}
    if not ready_now:
        entry["reason"] = "the encoder is warming up"
    return JSONResponse([{"name": name, **entry} for name in sorted(MODELS)])


@router.post("/repository/models/{name}/load")
@router.post("/repository/models/{name}/unload")
async def repository_control(request: Request, name: str) -> Response:
    """The models are this process's encoder: always loaded, never unloaded. Triton without explicit
    model control answers 503; a request this server refuses for good is the client's, so 403 here."""
    try:
        await require_read_key(request)
    except CnclipError as exc:
        return _error_response(exc)
    action = request.url.path.rsplit("/", 1)[-1]
    return v2_error(403, f"explicit model {action} is not allowed: this server always serves {', '.join(MODELS)}")


# Every method a client may send (OPTIONS too), so that none falls through to Starlette's /v1-shaped 405.
_ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


@router.api_route("", methods=[m for m in _ANY_METHOD if m not in ("GET", "HEAD")], include_in_schema=False)
@router.api_route("/{path:path}", methods=_ANY_METHOD, include_in_schema=False)
async def not_found(request: Request, path: str = "") -> Response:
    """Every other /v2 request: 405 on a route that exists with another method, else 404, in v2's shape."""
    for route in router.routes:  # this router's own routes: their paths carry the /v2 prefix
        if getattr(route, "endpoint", None) is not_found:
            continue
        match, _ = route.matches({**request.scope, "root_path": "", "path": request.url.path})
        if match is Match.PARTIAL:
            allowed = ", ".join(allowed_methods(request.app, request.url.path))
            return v2_error(405, "Method Not Allowed", {"Allow": allowed} if allowed else None)
    return v2_error(404, "Not Found")
