"""HTTP layer: FastAPI app factory, routes, schemas, auth, metrics; serves the web UI."""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # Lazy, so that importing a light module of `api` (the CLI reads `api.config`) does not import FastAPI.
    if name == "create_app":
        from api.app import create_app

        return create_app
    raise AttributeError(f"module 'api' has no attribute {name!r}")
