"""Small builders shared by the indexer tests: images, catalogs on a given database."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from indexer.catalog import SqlCatalog, open_catalog
from retrieval.config import Settings


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


def random_unit(n: int, dim: int, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
