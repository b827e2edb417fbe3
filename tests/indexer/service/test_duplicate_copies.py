"""What `cnclip index` records for near-duplicate groups, on SQLite and PostgreSQL: a second file with
the same bytes is a copy of the item (the identical tier) until it goes away (--prune), the original
goes (the copy becomes the item), the copy changes (it becomes an item of its own) or a user deletes
the item; the perceptual hash of every embedded file, and of files indexed before hashes existed or
hashed by an earlier hash version (nothing embedded again)."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from pathlib import Path

from sqlalchemy import text

from demo.duplicate_threshold import encoded, photo_like
from indexer.bulk.pipeline import ImageIndexer, IndexSummary
from indexer.domain.duplicates import DuplicatesPage
from indexer.domain.perceptual import PHASH_VERSION, phash_of_bytes
from indexer.service.collections import CollectionService
from indexer.storage.catalog import SqlCatalog
from indexer.storage.sql import duplicate_rows
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import jpeg, service_for


class CountingEncoder(FakeEncoder):
    def __init__(self) -> None:
        super().__init__(16)
        self.images = 0

    async def embed_images(self, images):  # type: ignore[no-untyped-def]
        self.images += len(images)
        return await super().embed_images(images)


def run(service: CollectionService, folder: Path, **kwargs: object) -> IndexSummary:
    indexer = ImageIndexer(service, "photos", batch_size=4, read_threads=2)
    return asyncio.run(indexer.run(folder, **kwargs))  # type: ignore[arg-type]


def counting_service(catalog: SqlCatalog) -> CollectionService:
    encoder = CountingEncoder()
    service = service_for(catalog, encoder)
    return service


def identical(service: CollectionService) -> list[list[tuple[str, bool]]]:
    """The identical groups as [(file name, is a copy)], keeper first."""
    page: DuplicatesPage = service.duplicates.page("photos", "identical", budget_s=None)
    return [[(Path(m.path or "").name, m.copy) for m in g.members] for g in page.groups]


def test_copies_are_recorded_and_forgotten_as_files_come_and_go(catalog: SqlCatalog, tmp_path: Path) -> None:
    service = counting_service(catalog)
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.jpg").write_bytes(jpeg(1))
    (folder / "b.jpg").write_bytes(jpeg(1))  # the same bytes twice
    (folder / "sub" / "c.jpg").write_bytes(jpeg(1))  # and a third time
    (folder / "d.jpg").write_bytes(jpeg(2))
    first = run(service, folder)
    assert (first.added, first.duplicates) == (2, 2)
    assert identical(service) == [[("a.jpg", False), ("b.jpg", True), ("c.jpg", True)]]
    [group] = service.duplicates.page("photos", "identical", budget_s=None).groups
    assert {m.item.id for m in group.members} == {group.members[0].item.id}  # one item, its copies
    assert [m.path and Path(m.path).relative_to(folder).as_posix() for m in group.members] == [
        "a.jpg",
        "b.jpg",
        "sub/c.jpg",
    ]
    assert run(service, folder).duplicates == 2  # a second run records the same copies, not more
    assert identical(service) == [[("a.jpg", False), ("b.jpg", True), ("c.jpg", True)]]

    (folder / "sub" / "c.jpg").unlink()
    run(service, folder)
    assert identical(service) == [[("a.jpg", False), ("b.jpg", True), ("c.jpg", True)]]  # kept until --prune
    run(service, folder, prune=True)
    assert identical(service) == [[("a.jpg", False), ("b.jpg", True)]]

    (folder / "a.jpg").unlink()  # the original goes: its copy becomes the item (same id, nothing embedded)
    item_id = group.members[0].item.id
    moved = run(service, folder, prune=True)
    assert (moved.renamed, moved.added, moved.pruned) == (1, 0, 0)
    assert identical(service) == []
    assert Path(catalog.get(item_id).path or "").name == "b.jpg"

    shutil.copy(folder / "b.jpg", folder / "e.jpg")
    run(service, folder)
    assert identical(service) == [[("b.jpg", False), ("e.jpg", True)]]
    (folder / "e.jpg").write_bytes(jpeg(3))  # the copy is edited: an item of its own now
    assert run(service, folder).added == 1
    assert identical(service) == []


def test_deleting_the_item_forgets_its_copies_and_remembers_the_bytes(catalog: SqlCatalog, tmp_path: Path) -> None:
    service = counting_service(catalog)
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(jpeg(1))
    (folder / "b.jpg").write_bytes(jpeg(1))
    run(service, folder)
    [group] = service.duplicates.page("photos", "identical", budget_s=None).groups
    assert service.delete_items([group.members[0].item.id]) == 1
    assert identical(service) == []
    with catalog.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM item_copies")).scalar() == 0
    again = run(service, folder)
    assert (again.added, again.deleted_before) == (0, 2)  # both paths hold the deleted bytes: they stay out
    assert identical(service) == []


def test_every_embedded_file_is_hashed_and_old_rows_are_hashed_without_embedding(
    catalog: SqlCatalog, tmp_path: Path
) -> None:
    service = counting_service(catalog)
    encoder = service.encoder
    folder = tmp_path / "photos"
    folder.mkdir()
    picture = photo_like(5)
    (folder / "big.jpg").write_bytes(encoded(picture, quality=95))
    (folder / "small.jpg").write_bytes(encoded(picture.resize((240, 180)), quality=70))
    (folder / "other.jpg").write_bytes(jpeg(7))
    assert run(service, folder).added == 3
    state = catalog.collection("photos")
    ids, hashes = duplicate_rows.hashed_items(catalog.engine, state.id)
    assert len(ids) == 3 and duplicate_rows.unhashed_count(catalog.engine, state.id) == 0
    by_name = {Path(catalog.get(int(i)).path or "").name: int(h) for i, h in zip(ids, hashes, strict=True)}
    assert bin((by_name["big.jpg"] ^ by_name["small.jpg"]) & (2**64 - 1)).count("1") <= 6

    # A catalog from before revision 0004: no hashes, so no resized tier yet, and the answer says so.
    with catalog.engine.begin() as connection:
        connection.execute(text("UPDATE items SET phash = NULL"))
    before = service.duplicates.page("photos", budget_s=None)
    assert before.unhashed == 3 and before.counts["resized"] == 0
    embedded = encoder.images
    dry = run(service, folder, dry_run=True)
    assert dry.would_index == 0
    summary = run(service, folder)
    assert (summary.hashed, summary.unchanged, summary.embedded) == (3, 3, 0)
    assert encoder.images == embedded  # nothing embedded again
    assert duplicate_rows.unhashed_count(catalog.engine, state.id) == 0
    assert run(service, folder).hashed == 0  # incremental: hashed rows are not read again
    assert service.duplicates.page("photos", budget_s=None).unhashed == 0


def test_uploads_are_hashed_by_the_service(catalog: SqlCatalog) -> None:
    from indexer.domain.records import NewImage
    from tests.support.indexer_helpers import random_unit

    service = service_for(catalog, FakeEncoder(16))
    service.create("photos", "images")
    [added] = service.writes.add_images("photos", [NewImage(encoded(photo_like(1), quality=90))], random_unit(1, 16))
    assert duplicate_rows.phashes_of(catalog.engine, [added.id]).keys() == {added.id}


def test_hash_missing_reads_uploads_from_their_copies_and_skips_changed_files(
    catalog: SqlCatalog, tmp_path: Path
) -> None:
    from indexer.domain.records import NewImage
    from tests.support.indexer_helpers import random_unit

    service = counting_service(catalog)
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(jpeg(1))
    (folder / "b.jpg").write_bytes(jpeg(2))
    run(service, folder)
    service.writes.add_images("photos", [NewImage(jpeg(3)), NewImage(jpeg(4))], random_unit(2, 16))
    with catalog.engine.begin() as connection:
        connection.execute(text("UPDATE items SET phash = NULL"))
    (folder / "b.jpg").write_bytes(jpeg(5))  # changed since it was indexed: not the indexed bytes
    progress: list[tuple[int, int]] = []
    assert service.duplicates.hash_missing("photos", lambda done, total: progress.append((done, total))) == 3
    assert progress[-1] == (4, 4)
    state = catalog.collection("photos")
    [left] = duplicate_rows.unhashed_ids(catalog.engine, state.id)
    assert Path(catalog.get(left).path or "").name == "b.jpg"


def test_hashes_of_an_earlier_version_are_compared_meanwhile_and_taken_again(
    catalog: SqlCatalog, tmp_path: Path
) -> None:
    """Revision 0009: a hash stored before it (version 1, `phash_version` NULL) still counts as a hash —
    `unhashed` stays 0 and it is compared — until `cnclip index` of its folder (nothing embedded again)
    or `--hash-missing` (uploads too) takes it at this version."""
    from indexer.domain.records import NewImage
    from tests.support.indexer_helpers import random_unit

    service = counting_service(catalog)
    folder = tmp_path / "photos"
    folder.mkdir()
    files = {"a.jpg": encoded(photo_like(1, (801, 601)), quality=90), "b.jpg": jpeg(2)}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    run(service, folder)
    upload = encoded(photo_like(11, (900, 500)), quality=90)
    service.writes.add_images("photos", [NewImage(upload)], random_unit(1, 16))
    state = catalog.collection("photos")
    with catalog.engine.begin() as connection:  # as revision 0009 leaves a catalog: version 1, hash kept
        connection.execute(text("UPDATE items SET phash_version = NULL, phash = 12345"))
    assert service.duplicates.page("photos", budget_s=None).unhashed == 0
    assert sorted(duplicate_rows.hashed_items(catalog.engine, state.id)[1]) == [12345] * 3  # compared meanwhile
    assert len(duplicate_rows.unhashed_ids(catalog.engine, state.id)) == 3

    embedded = service.encoder.images  # type: ignore[attr-defined]
    summary = run(service, folder)
    assert (summary.hashed, summary.embedded) == (2, 0) and service.encoder.images == embedded  # type: ignore[attr-defined]
    assert run(service, folder).hashed == 0  # taken at this version: not read again
    assert service.duplicates.hash_missing("photos") == 1  # the upload
    with catalog.engine.connect() as connection:
        rows = connection.execute(text("SELECT sha256, phash, phash_version FROM items")).all()
    expected = {hashlib.sha256(data).hexdigest(): phash_of_bytes(data) for data in [*files.values(), upload]}
    assert {sha: (phash, version) for sha, phash, version in rows} == {
        sha: (phash, PHASH_VERSION) for sha, phash in expected.items()
    }
    assert duplicate_rows.unhashed_ids(catalog.engine, state.id) == []
