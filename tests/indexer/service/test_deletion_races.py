"""Races between a user's deletion and writers of the same bytes, on SQLite and PostgreSQL.

- A deletion that commits while an indexer is embedding the same file keeps it deleted: the insert
  reads the remembered deletions after the collection's version bump, which the deletion takes too.
- Two uploads of the same new bytes at once both succeed (PostgreSQL: concurrent writers).
- Deleting the last row of an uploaded copy while the same bytes are being uploaded to another
  collection never removes the file the new row names: the copy is unlinked under the media lock,
  which every writer holds from writing its copy until its row commits.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import indexer.storage.sql.row_inserts
from indexer.bulk.pipeline import ImageIndexer
from indexer.domain.records import NewImage
from indexer.storage.media.store import media_file
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import jpeg, open_test_catalog, random_unit, service_for, write_images
from tests.support.postgres import fresh_schema

DIM = 32


class EncoderWithAMomentInside(FakeEncoder):
    """Runs `during` once, inside the first embedding call: what another process does meanwhile."""

    def __init__(self, during: Any) -> None:
        super().__init__(dim=DIM)
        self.during = during

    async def embed_images(self, images: Sequence[bytes]) -> np.ndarray:
        if self.during is not None:
            during, self.during = self.during, None
            await asyncio.to_thread(during)
        return await super().embed_images(images)


def test_a_deletion_committed_while_the_file_is_embedded_keeps_it_deleted(tmp_path: Path, catalog) -> None:  # type: ignore[no-untyped-def]
    """Two `cnclip index` runs over P and P/X: the run over P adds X/0000.jpg and the user deletes
    it while the run over P/X, which planned that file before it had a row, is embedding it."""
    folder = tmp_path / "P"
    files = write_images(folder / "X", 3)
    victim = files[0]
    setup = service_for(catalog, FakeEncoder(dim=DIM))
    setup.ensure("photos", "images")

    def the_other_run_then_the_user() -> None:
        [added] = catalog.add_images(
            "photos", [NewImage(data=victim.read_bytes(), path=str(victim))], random_unit(1, DIM)
        )
        assert added.created
        assert setup.delete_items([added.id]) == 1

    encoder = EncoderWithAMomentInside(the_other_run_then_the_user)
    service = service_for(catalog, encoder)
    summary = asyncio.run(ImageIndexer(service, "photos", batch_size=8).run(folder / "X"))

    assert summary.added == 2 and summary.deleted_before == 1, summary
    assert str(victim) not in catalog.file_states("photos")
    assert catalog.get_collection("photos").items == 2 and catalog.remembered_count("photos") == 1


def test_an_upload_of_deleted_bytes_is_added_again(catalog) -> None:  # type: ignore[no-untyped-def]
    """The remembered deletion keeps `cnclip index` from bringing bytes back; a user uploading them
    again asks for them explicitly."""
    service = service_for(catalog, FakeEncoder(dim=DIM))
    service.ensure("a", "images")
    [first] = service.writes.add_images("a", [NewImage(data=jpeg(1))], random_unit(1, DIM))
    service.delete_items([first.id])
    [again] = service.writes.add_images("a", [NewImage(data=jpeg(1))], random_unit(1, DIM))
    assert again.created and again.id != first.id and not again.deleted_by_user


def test_deleting_the_last_row_of_a_copy_while_its_bytes_are_uploaded_elsewhere_keeps_the_file(
    catalog,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Upload X to a; delete that item while X is being uploaded to b, between b's copy and b's
    commit. Both succeed, and b's item keeps its bytes."""
    service = service_for(catalog, FakeEncoder(dim=DIM))
    service.ensure("a", "images")
    service.ensure("b", "images")
    data = jpeg(7)
    [in_a] = service.writes.add_images("a", [NewImage(data=data)], random_unit(1, DIM))
    record = catalog.get(in_a.id)
    copy = media_file(catalog.media_dir, record.sha256, record.mime)
    assert copy.is_file()

    deleter_done = threading.Event()
    real_store = indexer.storage.sql.row_inserts.store_media

    def store_then_let_the_deletion_run(media_dir: Path, sha: str, mime: str | None, payload: bytes) -> Path:
        path = real_store(media_dir, sha, mime, payload)
        threading.Thread(target=lambda: (service.delete_items([in_a.id]), deleter_done.set()), daemon=True).start()
        # Long enough for the deletion to commit and remove the file if nothing stops it; it may
        # also block on the media lock until this upload commits, which is the point.
        deleter_done.wait(1.0)
        return path

    monkeypatch.setattr(indexer.storage.sql.row_inserts, "store_media", store_then_let_the_deletion_run)
    [in_b] = service.writes.add_images("b", [NewImage(data=data)], random_unit(1, DIM))
    assert deleter_done.wait(10), "the deletion never finished"

    assert in_b.created and catalog.get_collection("a").items == 0
    assert copy.is_file(), "the deletion in a removed the copy b's new row names"
    assert service.media(in_b.id)[1] == data


def test_the_last_deletion_of_a_copy_still_removes_it(catalog) -> None:  # type: ignore[no-untyped-def]
    service = service_for(catalog, FakeEncoder(dim=DIM))
    service.ensure("a", "images")
    service.ensure("b", "images")
    data = jpeg(8)
    [in_a] = service.writes.add_images("a", [NewImage(data=data)], random_unit(1, DIM))
    [in_b] = service.writes.add_images("b", [NewImage(data=data)], random_unit(1, DIM))
    record = catalog.get(in_a.id)
    copy = media_file(catalog.media_dir, record.sha256, record.mime)
    service.delete_items([in_a.id])
    assert copy.is_file()  # b still names it
    service.delete_collection("b")
    assert not copy.exists()
    assert in_b.created


@pytest.mark.postgres
def test_the_same_new_bytes_uploaded_to_two_collections_at_once_both_succeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both writers of one content-addressed copy meet at the temp file + rename (a temp name shared by
    the threads of one process let one rename take the other's file: FileNotFoundError, a 500).
    PostgreSQL only: SQLite has one writer at a time, so two uploads never write at once there."""
    with fresh_schema() as url:
        catalog = open_test_catalog(tmp_path / "data", url)
        try:
            upload_the_same_bytes_twice_at_once(catalog, monkeypatch)
        finally:
            catalog.close()


def upload_the_same_bytes_twice_at_once(catalog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import indexer.storage.media.store

    service = service_for(catalog, FakeEncoder(dim=DIM))
    service.ensure("a", "images")
    service.ensure("b", "images")
    both_writing = threading.Barrier(2, timeout=5)
    real_write = indexer.storage.media.store.write_atomically

    def write_together(path: Path, parts: Any, what: str) -> None:
        both_writing.wait()
        real_write(path, parts, what)

    monkeypatch.setattr(indexer.storage.media.store, "write_atomically", write_together)
    for round_ in range(20):
        data = jpeg(1000 + round_, size=(64, 48))
        outcomes: dict[str, Any] = {}

        def upload(name: str, data: bytes = data, outcomes: dict[str, Any] = outcomes) -> None:
            try:
                outcomes[name] = service.writes.add_images(name, [NewImage(data=data)], random_unit(1, DIM))[0]
            except Exception as exc:  # noqa: BLE001 (the outcome under test)
                outcomes[name] = exc

        threads = [threading.Thread(target=upload, args=(name,)) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert all(getattr(outcomes[n], "created", False) for n in "ab"), (round_, outcomes)
        assert service.media(outcomes["a"].id)[1] == data == service.media(outcomes["b"].id)[1]
    leftovers = [p.name for p in catalog.media_dir.rglob("*") if ".tmp-" in p.name]
    assert not leftovers
