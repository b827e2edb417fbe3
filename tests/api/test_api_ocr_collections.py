"""`POST /v1/collections {"ocr": true}` (docs/ocr.md): the flag in every collection answer, kept for the
collection's uploads, which are read for text (the fake engine reads a PNG's `ocr` chunk); collections
without it are never read; a text collection cannot have it."""

from __future__ import annotations

import pytest

from api.config import Settings
from tests.support.api_helpers import api_client, open_test_catalog
from tests.support.ocr_fakes import FakeOcrEngine, png_with_text


def test_a_collection_created_with_ocr_reads_its_uploads(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeOcrEngine()
    monkeypatch.setattr("indexer.runtime.open_rapidocr", lambda *args, **kwargs: engine)
    catalog = open_test_catalog(settings)
    try:
        with api_client(settings, catalog=catalog) as client:
            made = client.post("/v1/collections", json={"name": "signs", "kind": "images", "ocr": True})
            assert made.status_code == 201, made.text
            assert made.json()["ocr"] is True
            plain = client.post("/v1/collections", json={"name": "plain", "kind": "images"})
            assert plain.status_code == 201 and plain.json()["ocr"] is False
            assert client.get("/v1/collections/signs").json()["ocr"] is True
            listed = {c["name"]: c["ocr"] for c in client.get("/v1/collections").json()}
            assert listed == {"signs": True, "plain": False}

            ids = {}
            for name in ("signs", "plain"):
                upload = client.post(
                    f"/v1/collections/{name}/items",
                    files={"file": ("sign.png", png_with_text("北京烤鸭\n出口 B"), "image/png")},
                )
                assert upload.status_code == 201, upload.text
                ids[name] = upload.json()["id"]
            texts = catalog.texts.texts_for(list(ids.values()))
            assert set(texts) == {ids["signs"]} and texts[ids["signs"]].text == "北京烤鸭\n出口 B"
            assert engine.calls == 1

            refused = client.post("/v1/collections", json={"name": "words", "kind": "texts", "ocr": True})
            assert refused.status_code == 422 and "image collections" in refused.text
            assert client.get("/v1/collections/words").status_code == 404
    finally:
        catalog.close()
