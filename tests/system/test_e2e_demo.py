"""End to end: `cnclip demo --no-serve` on an empty data dir with the shipped model, then the real API
in-process, asked held-out queries (phrasings the model never trained on).

A result is a hit when its attributes match every attribute the query names; the demo gallery's
captions name every attribute of their picture, so a result's caption tells its attributes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from typer.testing import CliRunner

from api.app import create_app
from api.config import Settings
from cli.main import build_cli
from demo import dataset, vocabulary
from demo.gallery import GALLERY_SEED, GALLERY_SIZE, IMAGE_COLLECTION, TEXT_COLLECTION, demo_texts, describe
from indexer.runtime import open_catalog
from indexer.storage.sql.models import CollectionRow
from retrieval.config import SHIPPED_MODEL_DIR
from retrieval.manifest import ModelManifest

QUERIES = 150
IMAGE_QUERIES = 80
# The targets (t2i R@1 0.8, R@5 0.95, i2t R@1 0.8, zero-shot 0.9), asked through the REST API
# on the demo gallery (int8, the CPU default; the API's prompt-template ensemble for zero-shot).
FLOORS = {"t2i_r1": 0.8, "t2i_r5": 0.95, "i2t_r1": 0.8, "zeroshot_shape_acc": 0.9, "zeroshot_colour_acc": 0.9}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("demo-data")
    env = {"CNCLIP_DATA_DIR": str(data_dir), "CNCLIP_PROVIDER": "cpu", "CNCLIP_MODEL_DIR": str(SHIPPED_MODEL_DIR)}
    result = CliRunner().invoke(build_cli(), ["demo", "--no-serve"], env=env)
    assert result.exit_code == 0, result.output
    assert f"{IMAGE_COLLECTION}: {GALLERY_SIZE} pictures indexed, 0 already there" in result.output
    assert "红色的星星" in result.output and "cnclip serve --host" in result.output
    assert "http://" not in result.output  # --no-serve: nothing listens, so no URL is printed
    assert " items/s" in result.output  # the first run embeds, at some rate
    # A second run reuses the pictures and indexes nothing again.
    again = CliRunner().invoke(build_cli(), ["demo", "--no-serve"], env=env)
    assert again.exit_code == 0, again.output
    assert "reusing the demo gallery" in again.output
    assert f"{IMAGE_COLLECTION}: 0 pictures indexed, {GALLERY_SIZE} already there" in again.output
    assert "items/s" not in again.output  # nothing embedded: no "0.0 items/s"
    return data_dir


@pytest.fixture(scope="module")
def client(demo_dir: Path) -> Iterator[TestClient]:
    settings = Settings(_env_file=None, data_dir=demo_dir, model_dir=SHIPPED_MODEL_DIR, provider="cpu")
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def gallery() -> list[dataset.Sample]:
    return dataset.demo_gallery(GALLERY_SIZE, GALLERY_SEED)


def _attributes_by_caption(gallery: list[dataset.Sample]) -> dict[str, vocabulary.Attributes]:
    return {describe(s.attributes): s.attributes for s in gallery}


def _search(client: TestClient, query: str, k: int) -> list[dict]:
    response = client.post("/v1/search/text", json={"query": query, "k": k, "collection": IMAGE_COLLECTION})
    assert response.status_code == 200, response.text
    return response.json()["results"]


def test_red_stars_are_found(client: TestClient, gallery: list[dataset.Sample]) -> None:
    by_caption = _attributes_by_caption(gallery)
    red_stars = sum(1 for s in gallery if s.attributes.shape == "星形" and s.attributes.colour == "红色")
    assert red_stars >= 2
    results = _search(client, "红色的星星", 5)
    found = [by_caption[r["caption"]] for r in results]
    # Every result is red, and the gallery's red stars come first.
    assert all(a.colour == "红色" for a in found)
    assert all(a.shape == "星形" for a in found[: min(5, red_stars)])
    assert results[0]["image_url"] and "红色" in results[0]["tags"]
    # Like any `cnclip index` item, a demo picture has its path relative to the indexed folder (the manifest's).
    assert results[0]["filename"].startswith("demo-") and results[0]["path"] == f"images/{results[0]['filename']}"
    item = client.get(f"/v1/items/{results[0]['id']}").json()
    assert item["path"] == results[0]["path"]


def test_heldout_text_to_image_recall(client: TestClient, gallery: list[dataset.Sample]) -> None:
    by_caption = _attributes_by_caption(gallery)
    rng = random.Random(11)
    hits1, hits5 = [], []
    for s in rng.sample(gallery, QUERIES):
        query = dataset.caption(s.attributes, rng, dataset.HELDOUT_TEMPLATES)
        found = [by_caption[r["caption"]].matches(query.named) for r in _search(client, query.text, 5)]
        hits1.append(found[0])
        hits5.append(any(found))
    assert sum(hits1) / QUERIES >= FLOORS["t2i_r1"]
    assert sum(hits5) / QUERIES >= FLOORS["t2i_r5"]


def _upload(demo_dir: Path, index: int) -> tuple[str, bytes, str]:
    return (f"demo-{index:04d}.png", (demo_dir / "demo" / "images" / f"demo-{index:04d}.png").read_bytes(), "image/png")


def test_image_to_text_recall(client: TestClient, demo_dir: Path, gallery: list[dataset.Sample]) -> None:
    named = {t["text"]: t["extra"]["named"] for t in demo_texts(gallery, GALLERY_SEED)}
    rng = random.Random(12)
    hits = []
    for i in rng.sample(range(len(gallery)), IMAGE_QUERIES):
        response = client.post(
            "/v1/search/image",
            files={"file": _upload(demo_dir, i)},
            data={"k": "1", "target": "texts", "collection": TEXT_COLLECTION},
        )
        assert response.status_code == 200, response.text
        text = response.json()["results"][0]["caption"]
        hits.append(gallery[i].attributes.matches(named[text]))
    assert sum(hits) / len(hits) >= FLOORS["i2t_r1"]


@pytest.mark.parametrize(("labels", "key"), [(list(vocabulary.SHAPES), "shape"), (list(vocabulary.COLOURS), "colour")])
def test_zero_shot_classification(
    client: TestClient, demo_dir: Path, gallery: list[dataset.Sample], labels: list[str], key: str
) -> None:
    rng = random.Random(13)
    right = []
    for i in rng.sample(range(len(gallery)), 50):
        response = client.post(
            "/v1/classify",
            files={"file": _upload(demo_dir, i)},
            data={"labels": json.dumps(labels, ensure_ascii=False)},
        )
        assert response.status_code == 200, response.text
        ranked = response.json()
        assert abs(sum(p["probability"] for p in ranked) - 1.0) < 1e-3
        right.append(ranked[0]["label"] == getattr(gallery[i].attributes, key))
    assert sum(right) / len(right) >= FLOORS[f"zeroshot_{key}_acc"]


def test_demo_reindexes_collections_an_earlier_model_embedded(tmp_path: Path) -> None:
    """After an upgrade of the shipped model, the demo's old vectors are replaced, not searched."""
    env = {"CNCLIP_DATA_DIR": str(tmp_path), "CNCLIP_PROVIDER": "cpu", "CNCLIP_MODEL_DIR": str(SHIPPED_MODEL_DIR)}
    assert CliRunner().invoke(build_cli(), ["demo", "--no-serve"], env=env).exit_code == 0
    settings = Settings(_env_file=None, data_dir=tmp_path, model_dir=SHIPPED_MODEL_DIR)
    catalog = open_catalog(settings)
    with catalog.engine.begin() as connection:  # as the previous release recorded it: the bare name
        connection.execute(update(CollectionRow).values(model="cnclip-demo"))
    catalog.close()
    again = CliRunner().invoke(build_cli(), ["demo", "--no-serve"], env=env)
    assert again.exit_code == 0, again.output
    assert f"re-indexed {IMAGE_COLLECTION} (embedded with cnclip-demo)" in again.output
    assert f"{IMAGE_COLLECTION}: {GALLERY_SIZE} pictures indexed, 0 already there" in again.output
    catalog = open_catalog(settings)
    try:
        infos = {c.name: c for c in catalog.list_collections()}
        assert {infos[IMAGE_COLLECTION].model, infos[TEXT_COLLECTION].model} == {
            ModelManifest.load(SHIPPED_MODEL_DIR).model_id
        }
        assert infos[IMAGE_COLLECTION].items == infos[IMAGE_COLLECTION].vectors == GALLERY_SIZE
    finally:
        catalog.close()


def test_demo_on_a_busy_port_fails_before_drawing_anything(tmp_path: Path) -> None:
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = {"CNCLIP_DATA_DIR": str(tmp_path), "CNCLIP_MODEL_DIR": str(SHIPPED_MODEL_DIR)}
        result = CliRunner().invoke(build_cli(), ["demo", "--port", str(port)], env=env)
    assert result.exit_code == 1
    assert result.output == f"error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert not (tmp_path / "demo").exists()  # no gallery drawn, nothing indexed
