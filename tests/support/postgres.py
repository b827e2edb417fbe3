"""A fresh PostgreSQL schema per test, so tests on the shared server never see each other's rows."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine

# The server docs/development.md names and CI starts; tests fail (never skip) when it is not reachable.
POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@contextmanager
def fresh_schema() -> Iterator[str]:
    """A URL whose connections use a new empty schema (search_path), dropped afterwards."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    engine = create_engine(POSTGRES_URL)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    finally:
        with engine.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        engine.dispose()
