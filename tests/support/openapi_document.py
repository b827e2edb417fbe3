"""The app's OpenAPI document as the tests see it, and where its committed copy lives (the contract test
compares the two; the name checks walk its paths)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from api.app import create_app
from api.config import Settings
from retrieval.fake import FakeEncoder

SNAPSHOT = Path(__file__).resolve().parents[1] / "snapshots" / "openapi.json"


def current_document() -> dict[str, Any]:
    """The document of an app with default settings (the document does not depend on them)."""
    settings = Settings(_env_file=None, data_dir=Path("/nonexistent"))
    return create_app(settings, encoder=FakeEncoder(), catalog=object()).openapi()  # type: ignore[arg-type]
