"""Small builders shared by the indexer tests: images, catalogs on a given database."""

from __future__ import annotations

import io
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from api.config import Settings
from indexer.runtime import open_catalog
from indexer.service.collections import CollectionService
from indexer.storage.catalog import SqlCatalog
from indexer.storage.sql.db import DatabaseUnavailable
from tests.support.cli_server import CNCLIP


def jpeg(seed: int, size: tuple[int, int] = (24, 16)) -> bytes:
    """A small distinct JPEG (noise from `seed`, so every seed gives different bytes)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def png(seed: int, size: tuple[int, int] = (20, 12)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def catalog_settings(data_dir: Path, database_url: str, **overrides: object) -> Settings:
    return Settings(_env_file=None, data_dir=data_dir, database_url=database_url, **overrides)  # type: ignore[arg-type]


def open_test_catalog(data_dir: Path, database_url: str, **overrides: object) -> SqlCatalog:
    return open_catalog(catalog_settings(data_dir, database_url, **overrides))


def create_once(catalog: SqlCatalog, name: str, kind: str, model: str, dim: int, index: str = "Flat") -> None:
    """Create the collection unless it exists (engine tests fill one collection in several steps)."""
    import contextlib

    from retrieval.errors import Conflict

    with contextlib.suppress(Conflict):
        catalog.create_collection(name, kind, model, dim, index)  # type: ignore[arg-type]


def faiss_file(settings: Settings, collection_id: int) -> Path:
    """Where the FAISS engine keeps a collection's file for these settings (without opening it)."""
    from indexer.storage.vectors.base import StoreSpec
    from indexer.storage.vectors.faiss.store import FaissEngine
    from indexer.storage.vectors.registry import open_vector_engine

    engine = open_vector_engine(settings, settings.sqlalchemy_url)
    assert isinstance(engine, FaissEngine)
    return engine.path(StoreSpec(collection_id, "", 1, "Flat", "", ""))


def faiss_index(catalog: SqlCatalog, name: str) -> Any:
    """The in-memory `VectorIndex` of a collection of a FAISS catalog."""
    return catalog.store(name).store.index  # type: ignore[attr-defined]


def service_for(catalog: SqlCatalog, encoder: Any, **options: Any) -> CollectionService:
    """The collection service for `encoder`'s model over `catalog`."""
    return CollectionService(catalog, encoder, **options)


def random_unit(n: int, dim: int, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def unit(vectors: np.ndarray) -> np.ndarray:
    """`vectors` (one, or one a row) scaled to length 1, as float32."""
    return (vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)).astype(np.float32)


def near(base: np.ndarray, rng: np.random.Generator, cosine: float) -> np.ndarray:
    """A unit vector at exactly `cosine` from the unit vector `base`, in a random direction."""
    noise = rng.standard_normal(base.shape)
    noise -= np.dot(noise, base) * base
    return unit(cosine * base + np.sqrt(1 - cosine**2) * unit(noise))


def cli_env(data_dir: Path, database_url: str, model_dir: Path, **extra: str) -> dict[str, str]:
    """Environment for a `cnclip` subprocess on this database and the toy model."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("CNCLIP_")}
    env.update(
        CNCLIP_DATA_DIR=str(data_dir),
        CNCLIP_DATABASE_URL=database_url,
        CNCLIP_MODEL_DIR=str(model_dir),
        CNCLIP_PROVIDER="cpu",
        **extra,
    )
    return env


def start_cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CNCLIP, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_cnclip(args: list[str], env: dict[str, str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """`cnclip ARGS` in a fresh process, stdout and stderr apart (what a shell user sees on each), no stdin;
    a hang past `timeout_s` fails the test instead of the suite."""
    return subprocess.run(
        [*CNCLIP, *args], env=env, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
    )


def committed_items(engine: Engine) -> int:
    """Rows committed so far (0 while the schema does not exist yet). An engine made by
    `create_db_engine` reports the missing table, seen while the indexer's migration is still
    creating it, as `DatabaseUnavailable`; a plain engine as the driver's error."""
    try:
        with engine.connect() as connection:
            return int(connection.exec_driver_sql("SELECT count(*) FROM items").scalar() or 0)
    except (DBAPIError, DatabaseUnavailable):
        return 0


def wait_for_items(engine: Engine, process: subprocess.Popen[str], at_least: int, timeout: float = 60.0) -> bool:
    """Poll until `at_least` rows are committed (True) or the process ended first (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if committed_items(engine) >= at_least:
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.01)
    raise TimeoutError(f"fewer than {at_least} items committed after {timeout} s")


def write_images(folder: Path, count: int, size: tuple[int, int] = (16, 16)) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for i in range(count):
        path = folder / f"{i:04d}.jpg"
        path.write_bytes(jpeg(i, size))
        written.append(path)
    return written
