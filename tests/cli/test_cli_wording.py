"""Errors of the layers that commands and the server share say what is wrong in words true for both: a
command (`cnclip index`, `cnclip search`) runs no server, so "the server runs …" was wrong there."""

from __future__ import annotations

from pathlib import Path

import pytest

from indexer.domain.paging import PageRequest
from indexer.domain.records import NewImage
from retrieval.errors import InvalidInput
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import jpeg, open_test_catalog, random_unit, service_for

DIM = 32


def test_another_models_collection_is_refused_naming_the_settings_not_a_server(tmp_path: Path) -> None:
    catalog = open_test_catalog(tmp_path / "data", f"sqlite:///{tmp_path / 'data' / 'catalog.db'}")
    try:
        old = service_for(catalog, FakeEncoder(dim=DIM, model_id="old@0123456789ab"))
        new = service_for(catalog, FakeEncoder(dim=DIM, model_id="new@ba9876543210"))
        old.create("photos", "images")
        old.writes.add_images("photos", [NewImage(data=jpeg(1))], random_unit(1, DIM))
        with pytest.raises(InvalidInput) as refused:
            new.search.vector("photos", "images", random_unit(1, DIM)[0], PageRequest(k=5))
    finally:
        catalog.close()
    message = refused.value.message
    assert "server" not in message
    assert "CNCLIP_MODEL_DIR / CNCLIP_MODEL_DIRS: new@ba9876543210 (32-d)" in message
    assert "indexed with old@0123456789ab (32-d vectors)" in message
