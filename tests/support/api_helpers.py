"""Helpers shared by the API and browser tests: images made in memory, a catalog, a client."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient
from PIL import Image

from api import create_app
from api.config import Settings
from indexer.service.ports import Catalog
from retrieval.fake import FakeEncoder


def image_bytes(color: tuple[int, int, int], size: tuple[int, int] = (64, 48), fmt: str = "PNG") -> bytes:
    """A solid-colour image with a diagonal stripe (so thumbnails have something to show)."""
    img = Image.new("RGB", size, color)
    for i in range(min(size)):
        img.putpixel((i, i), (255 - color[0], 255 - color[1], 255 - color[2]))
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


# A small gallery: (caption, tags, colour).
GALLERY = [
    ("穿红色裙子的女孩", ["人物", "红色"], (200, 30, 40)),
    ("草地上的小狗", ["动物", "狗"], (60, 160, 60)),
    ("蓝天下的海滩", ["风景"], (40, 110, 220)),
    ("黄色的出租车", ["汽车"], (230, 200, 20)),
    ("一只黑猫", ["动物", "猫"], (20, 20, 20)),
    ("white snowy mountain", ["风景", "雪"], (235, 235, 240)),
]
CAPTIONS = ["一只猫", "一只狗", "一辆汽车", "海边的日落", "a red dress"]


def open_test_catalog(settings: Settings) -> Catalog:
    """The real catalog (SQLite + FAISS under the settings' data dir)."""
    from indexer.runtime import open_catalog

    return open_catalog(settings)


@contextmanager
def api_client(
    settings: Settings, encoder: Any | None = None, catalog: Catalog | None = None, **client_kwargs: Any
) -> Iterator[TestClient]:
    """A TestClient on `create_app` with a FakeEncoder and the real catalog unless given."""
    encoder = encoder if encoder is not None else FakeEncoder()
    own = catalog is None
    catalog = catalog if catalog is not None else open_test_catalog(settings)
    try:
        with TestClient(create_app(settings, encoder=encoder, catalog=catalog), **client_kwargs) as client:
            yield client
    finally:
        if own:
            catalog.close()


def seed(client: TestClient, headers: dict[str, str] | None = None) -> dict[str, int]:
    """Create `photos` (images) and `captions` (texts) through the API; caption -> item id."""
    headers = headers or {}
    ids: dict[str, int] = {}
    r = client.post("/v1/collections", json={"name": "photos", "kind": "images"}, headers=headers)
    assert r.status_code == 201, r.text
    for caption, tags, color in GALLERY:
        r = client.post(
            "/v1/collections/photos/items",
            files={"file": (f"{caption}.png", image_bytes(color), "image/png")},
            data={"caption": caption, "tags": ",".join(tags)},
            headers=headers,
        )
        assert r.status_code == 201, r.text
        ids[caption] = r.json()["id"]
    r = client.post("/v1/collections", json={"name": "captions", "kind": "texts"}, headers=headers)
    assert r.status_code == 201, r.text
    r = client.post("/v1/collections/captions/texts", json={"texts": CAPTIONS}, headers=headers)
    assert r.status_code == 201, r.text
    for text, item in zip(CAPTIONS, r.json()["items"], strict=True):
        ids[text] = item["id"]
    return ids
