"""The OpenAPI document is committed (tests/snapshots/openapi.json): a change to it must be deliberate.
Regenerate with `python -m tests.contract.test_openapi` and review the diff. Also: every operation is in
api/openapi.py's table, errors use the project's schema, and the API key is a security scheme."""

from __future__ import annotations

import json

from api.openapi import ROUTES
from tests.support.openapi_document import SNAPSHOT, current_document


def test_the_document_matches_the_snapshot() -> None:
    committed = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    assert current_document() == committed, "the OpenAPI document changed: run `python -m tests.contract.test_openapi`"


def test_every_operation_documents_its_errors_in_the_project_shape() -> None:
    doc = current_document()
    assert set(doc["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    v1_ops = {(m, p) for p, ops in doc["paths"].items() if not p.startswith("/v2") for m in ops}
    assert v1_ops == set(ROUTES)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            responses = op["responses"]
            assert "500" in responses, (method, path)
            for status, response in responses.items():
                schema = response.get("content", {}).get("application/json", {}).get("schema", {})
                if int(status) >= 400:
                    ref = schema["$ref"]
                    assert ref.endswith("/V2Error" if path.startswith("/v2") else "/Error"), (method, path, status)
    assert {"200", "201"} <= set(doc["paths"]["/v1/label-sets/{name}"]["put"]["responses"])
    assert doc["paths"]["/v1/collections"]["post"]["security"] == [{"bearer": []}, {"apiKey": []}]
    for probe in ("/v2/health/live", "/v2/health/ready", "/v2/models/{name}/ready"):
        assert "content" not in doc["paths"][probe]["get"]["responses"]["200"]  # an empty body, as Triton's


if __name__ == "__main__":
    SNAPSHOT.write_text(
        json.dumps(current_document(), indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8"
    )
    print(f"wrote {SNAPSHOT}")
