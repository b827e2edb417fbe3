"""The OpenAPI document, made to tell the truth about what the server answers.

FastAPI documents a route's success response and a 422 in its own validation-error shape. This
server sends every error as `{"error": {"code", "message"}}` (the `/v2` routes: `{"error": "..."}`),
can answer 401/404/409/410/413/429/500/501/503 too, and takes an API key. So after FastAPI builds the
document, `document_errors` adds to each operation the error statuses it can produce (the table
`ROUTES` and the rule in `_statuses`), with the project's error schema, and the key as two
security schemes. `tests/contract/test_openapi.py` keeps a committed snapshot of the result:
a change to the document must be deliberate.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "additionalProperties": False,
            "properties": {
                "code": {"type": "string", "description": "Stable, machine-readable: not_found, invalid_input, …"},
                "message": {"type": "string", "description": "For people; a 5xx quotes the request id."},
            },
        }
    },
}
V2_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}
SECURITY_SCHEMES: dict[str, Any] = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "CNCLIP_API_KEY as `Authorization: Bearer <key>`."},
    "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key", "description": "CNCLIP_API_KEY."},
}
_KEY: list[dict[str, list[str]]] = [{"bearer": []}, {"apiKey": []}]
_OPTIONAL_KEY = [{}, *_KEY]  # needed only with CNCLIP_REQUIRE_KEY_FOR_READS

_DESCRIPTIONS = {
    400: "The request breaks the KServe v2 protocol or the model's input contract.",
    401: "The API key is missing or wrong.",
    403: "Refused for good: this server does not do that (/v2 explicit model load / unload).",
    404: "No such collection, item, label set or model.",
    408: "The request body did not arrive in time.",
    409: "It clashes with what exists.",
    410: "The item's file has changed since it was indexed.",
    413: "The body is larger than the limit.",
    415: "A request `Content-Encoding` other than gzip, deflate or identity.",
    422: "The input cannot be used (validation, unreadable image).",
    429: "The encoder's queue is full (or another duplicate search is running); retry after `Retry-After` seconds.",
    500: "A bug; the message quotes the request id to report.",
    501: "Not supported here, for good: do not retry (a Milvus server that cannot run the request, "
    "`vector_store_incompatible`).",
    503: "Not ready: the encoder is warming up or unreachable, or the database is down or locked; "
    "retry after `Retry-After` seconds.",
    507: "The server's disk (or quota) is full; nothing was stored.",
}
# Success bodies FastAPI cannot infer from the route's return type.
_MEDIA_200 = {"content": {"image/*": {"schema": {"type": "string", "format": "binary"}}}, "description": "The bytes."}
_SUCCESS: dict[tuple[str, str], dict[str, Any]] = {
    ("get", "/v1/items/{item_id}/image"): {"200": _MEDIA_200},
    ("get", "/v1/items/{item_id}/thumbnail"): {
        "200": {"content": {"image/jpeg": {"schema": {"type": "string", "format": "binary"}}}, "description": "JPEG"}
    },
    ("get", "/metrics"): {
        "200": {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text format."}
    },
}


# Every /v1 operation: who may call it, and the statuses its resources and logic add to the ones its
# parameters imply (see `_statuses`). A route missing here fails tests/contract/test_openapi.py.
_R, _W, _OPEN = "read", "write", "open"
_ENC = {429, 503}  # embeds through the batcher: queue full, encoder not ready
# A collection or item that may not exist; a vector engine that refuses for good (a Milvus version
# that cannot run it); catalog not open.
_CAT = {404, 501, 503}
ROUTES: dict[tuple[str, str], tuple[str, set[int]]] = {
    ("post", "/v1/search/text"): (_R, _ENC | _CAT),
    ("post", "/v1/search/image"): (_R, _ENC | _CAT),
    ("post", "/v1/classify"): (_R, _ENC | {404}),
    ("post", "/v1/embed/text"): (_R, _ENC),
    ("post", "/v1/embed/image"): (_R, _ENC),
    ("get", "/v1/collections"): (_R, _CAT),
    ("post", "/v1/collections"): (_W, _CAT | {409}),
    ("get", "/v1/collections/{name}"): (_R, _CAT),
    ("delete", "/v1/collections/{name}"): (_W, _CAT),
    ("get", "/v1/collections/{name}/duplicates"): (_R, _CAT | {429}),  # 429: another duplicate search runs
    ("post", "/v1/collections/{name}/items"): (_W, _ENC | _CAT | {409, 507}),
    ("post", "/v1/collections/{name}/texts"): (_W, _ENC | _CAT | {409, 507}),
    ("get", "/v1/items/{item_id}"): (_R, _CAT),
    ("delete", "/v1/items/{item_id}"): (_W, _CAT),
    ("get", "/v1/items/{item_id}/image"): (_R, _CAT | {410}),
    ("get", "/v1/items/{item_id}/thumbnail"): (_R, _CAT | {410}),
    ("get", "/v1/items/{item_id}/similar"): (_R, _ENC | _CAT),
    ("get", "/v1/label-sets"): (_R, set()),
    ("get", "/v1/label-sets/{name}"): (_R, {404}),
    ("put", "/v1/label-sets/{name}"): (_W, set()),
    ("delete", "/v1/label-sets/{name}"): (_W, {404}),
    ("get", "/healthz"): (_OPEN, set()),
    ("get", "/readyz"): (_OPEN, {503}),
    ("get", "/metrics"): (_R, set()),
}


def _statuses(op: dict[str, Any], access: str, extra: set[int]) -> set[int]:
    """Error statuses of one operation: 500 always; 401 behind the key; 422 for any parameter or
    body; 408/413 for a body; 404 for a path parameter; plus the route's own (`ROUTES`)."""
    params = {p.get("in") for p in op.get("parameters", [])}
    statuses = {500} | extra
    if access != _OPEN:
        statuses.add(401)
    if params or "requestBody" in op:
        statuses.add(422)
    if "requestBody" in op:
        statuses |= {408, 413}
    if "path" in params:
        statuses.add(404)
    return statuses


def _error_response(status: int, schema_ref: str) -> dict[str, Any]:
    return {
        "description": _DESCRIPTIONS[status],
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}},
    }


def _document_v1(schema: dict[str, Any]) -> None:
    for path, ops in schema["paths"].items():
        if path.startswith("/v2"):
            continue
        for method, op in ops.items():
            access, extra = ROUTES[(method, path)]
            responses = op.setdefault("responses", {})
            for status in sorted(_statuses(op, access, extra)):
                responses[str(status)] = _error_response(status, "Error")
            responses.update(_SUCCESS.get((method, path), {}))
            if (method, path) == ("put", "/v1/label-sets/{name}"):
                responses["201"] = {**responses["200"], "description": "Created (200: replaced)."}
            if access != _OPEN:
                op["security"] = _KEY if access == _W else _OPTIONAL_KEY


_V2_STATUSES = {
    "/v2": {500},
    "/v2/health/live": {500},
    "/v2/health/ready": {400, 500},
    "/v2/models/stats": {401, 500},
    "/v2/models/{name}": {400, 401, 404, 500, 503},
    "/v2/models/{name}/versions/{version}": {400, 401, 404, 500, 503},
    "/v2/models/{name}/config": {400, 401, 404, 500},
    "/v2/models/{name}/versions/{version}/config": {400, 401, 404, 500},
    "/v2/models/{name}/stats": {400, 401, 500},
    "/v2/models/{name}/versions/{version}/stats": {400, 401, 500},
    "/v2/models/{name}/ready": {400, 500},
    "/v2/models/{name}/versions/{version}/ready": {400, 500},
    "/v2/repository/index": {400, 401, 500},
    "/v2/repository/models/{name}/load": {401, 403, 500},
    "/v2/repository/models/{name}/unload": {401, 403, 500},
    "/v2/models/{name}/infer": {400, 401, 404, 408, 413, 415, 429, 500, 503},
    "/v2/models/{name}/versions/{version}/infer": {400, 401, 404, 408, 413, 415, 429, 500, 503},
}
# Routes that answer like Triton with a status and an empty body (health and readiness probes).
_V2_EMPTY_OK = (
    "/v2/health/live",
    "/v2/health/ready",
    "/v2/models/{name}/ready",
    "/v2/models/{name}/versions/{version}/ready",
)
_INFER_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}},
        "application/octet-stream": {
            "schema": {"type": "string", "format": "binary"},
            "description": "Binary tensor data extension: JSON header (Inference-Header-Content-Length) + raw tensors.",
        },
    },
}


def _document_v2(schema: dict[str, Any], path: str, ops: dict[str, Any]) -> None:
    for method, op in ops.items():
        responses = op.setdefault("responses", {})
        responses.pop("422", None)  # v2 routes answer bad input with 400 in the v2 shape
        for status in sorted(_V2_STATUSES.get(path, {500})):
            responses[str(status)] = _error_response(status, "V2Error")
        if path in _V2_EMPTY_OK:
            responses["200"] = {"description": "Live / ready: an empty body, as Triton answers."}
        if path.endswith("/infer") and method == "post":
            op["requestBody"] = _INFER_BODY
            responses["200"]["content"]["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
        if path.startswith("/v2/models/") and not path.endswith("/ready"):
            op["security"] = _OPTIONAL_KEY


# The text rule (api/values.py) as the document says it: no request string holds NUL. (A lone surrogate
# cannot be written in a JSON Schema string.) A string with no pattern gets NO_NUL; a negated class of
# an existing pattern excludes NUL too; `\S` ("not blank") becomes NON_BLANK.
NO_NUL = "^[^\\u0000]*$"
NON_BLANK = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"


def _no_nul(node: Any, schemas: dict[str, Any], seen: set[str]) -> None:
    """Put the text rule on every plain string schema under `node`, following refs into `schemas`."""
    if isinstance(node, list):
        for item in node:
            _no_nul(item, schemas, seen)
        return
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/") and ref not in seen:
        seen.add(ref)
        _no_nul(schemas.get(ref.rsplit("/", 1)[1]), schemas, seen)
    if node.get("type") == "string" and not {"format", "enum", "const", "contentMediaType"} & set(node):
        pattern = node.get("pattern")
        node["pattern"] = (
            NO_NUL if pattern is None else NON_BLANK if pattern == "\\S" else pattern.replace("[^", "[^\\u0000")
        )
    for key, value in node.items():
        if key != "$ref":
            _no_nul(value, schemas, seen)


def document_text_rule(schema: dict[str, Any]) -> None:
    """Every string a /v1 request takes (parameters, bodies and the schemas they name) says it holds no NUL."""
    schemas = schema.get("components", {}).get("schemas", {})
    seen: set[str] = set()
    for path, ops in schema["paths"].items():
        if path.startswith("/v1"):
            for op in ops.values():
                _no_nul([p.get("schema") for p in op.get("parameters", [])], schemas, seen)
                _no_nul(op.get("requestBody"), schemas, seen)


def document_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """Add error responses, error schemas and the API key's security schemes to `schema`."""
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["Error"] = ERROR_SCHEMA
    schemas["V2Error"] = V2_ERROR_SCHEMA
    from api.kserve_tensors import InferRequest  # the /v2 infer body, parsed by hand in the route

    schemas.update(InferRequest.model_json_schema(ref_template="#/components/schemas/{model}").pop("$defs", {}))
    schemas["InferRequest"] = InferRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components["securitySchemes"] = SECURITY_SCHEMES
    document_text_rule(schema)
    _document_v1(schema)
    for path, ops in schema["paths"].items():
        if path.startswith("/v2"):
            _document_v2(schema, path, ops)
    return schema


def install_openapi(app: FastAPI) -> None:
    """Make `app.openapi()` (and `/openapi.json`) return the corrected document, built once."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = document_errors(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
