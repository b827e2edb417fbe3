"""The bulk pipeline with the fake encoder: incremental runs, changes, renames, duplicates, bad files,
prune, dry run, manifests, stop-and-resume. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from indexer.bulk.pipeline import ImageIndexer, IndexSummary
from indexer.storage.catalog import SqlCatalog
from retrieval.errors import InvalidImage
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import jpeg, png, service_for

DIM = 16


class PickyEncoder(FakeEncoder):
    """Refuses images containing b"REFUSE" the way the real encoder refuses undecodable ones."""

    async def embed_images(self, images: Sequence[bytes]) -> np.ndarray:
        if any(b"REFUSE" in data for data in images):
            raise InvalidImage("the image data is corrupt or truncated")
        return await super().embed_images(images)

    def embedded(self) -> int:
        return sum(n for tower, n in self.calls if tower == "image")


def make_folder(root: Path, count: int = 12) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    for i in range(count):
        folder = root / ("sub/deeper" if i % 5 == 0 else "sub" if i % 3 == 0 else "")
        (folder / f"img{i:02d}.{'png' if i % 4 == 1 else 'jpg'}").write_bytes(png(i) if i % 4 == 1 else jpeg(i))
    (root / "notes.txt").write_text("not an image, not a problem")
    (root / "no_extension").write_bytes(jpeg(100))  # detected by content, not by name
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 30)  # starts like a JPEG
    (root / "fake.png").write_bytes(b"hello")  # an image name, no image inside
    (root / "copy.jpg").write_bytes(jpeg(2))  # the same bytes as img02.jpg
    return root


def run(catalog: SqlCatalog, encoder: FakeEncoder, source: Path, **kwargs: object) -> IndexSummary:
    indexer = ImageIndexer(service_for(catalog, encoder), "photos", batch_size=4, read_threads=2)
    return asyncio.run(indexer.run(source, **kwargs))  # type: ignore[arg-type]


def paths(catalog: SqlCatalog) -> dict[str, int]:
    return {path: state.id for path, state in catalog.file_states("photos").items()}


def assert_consistent(catalog: SqlCatalog) -> None:
    assert list(catalog.index_ids("photos")) == list(catalog.sql_ids("photos"))


def test_first_run_then_incremental(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "photos")
    encoder = PickyEncoder(DIM)
    summary = run(catalog, encoder, folder)
    assert (summary.added, summary.duplicates, summary.not_images) == (13, 1, 1)
    assert sorted(Path(p).name for p, _ in summary.failures) == ["broken.jpg", "fake.png"]
    assert all(reason for _, reason in summary.failures)
    indexed = paths(catalog)
    assert len(indexed) == 13 and str(folder / "sub" / "deeper" / "img00.jpg") in indexed
    assert (str(folder / "img02.jpg") in indexed) != (str(folder / "copy.jpg") in indexed)  # exactly one of the pair
    assert_consistent(catalog)
    assert encoder.embedded() == 13

    again = run(catalog, encoder, folder)
    assert (again.added, again.unchanged, again.embedded) == (0, 13, 0)
    assert encoder.embedded() == 13  # nothing re-embedded
    assert paths(catalog) == indexed


def test_changed_touched_renamed_deleted_files(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "photos")
    encoder = PickyEncoder(DIM)
    run(catalog, encoder, folder)
    before = paths(catalog)
    changed, touched, moved = folder / "img04.jpg", folder / "img07.jpg", folder / "img08.jpg"
    changed.write_bytes(jpeg(500))
    os.utime(touched, (1_000_000, 1_000_000))  # new mtime, same bytes
    moved_to = folder / "sub" / "renamed.jpg"
    shutil.move(moved, moved_to)
    (folder / "img11.jpg").unlink()
    embedded = encoder.embedded()

    summary = run(catalog, encoder, folder, prune=True)
    assert (summary.changed, summary.renamed, summary.pruned, summary.added) == (1, 1, 1, 0)
    assert encoder.embedded() == embedded + 1  # only the changed file went through the encoder
    after = paths(catalog)
    assert after[str(changed)] != before[str(changed)]  # new content, new row
    assert after[str(moved_to)] == before[str(moved)] and str(moved) not in after  # same row, new path
    assert after[str(touched)] == before[str(touched)]
    assert catalog.get(after[str(touched)]).mtime == 1_000_000
    assert str(folder / "img11.jpg") not in after and len(after) == 12
    hit = catalog.search("photos", FakeEncoder(DIM).embed_images_sync([jpeg(500)])[0], k=1)[0]
    assert hit.id == after[str(changed)]
    assert_consistent(catalog)
    assert run(catalog, encoder, folder).unchanged == 12  # the touched file is not read again


def test_dry_run_changes_nothing(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "photos")
    encoder = PickyEncoder(DIM)
    summary = run(catalog, encoder, folder, dry_run=True)
    # 12 images + no_extension; copy.jpg has img02's bytes; broken.jpg and fake.png fail; notes.txt is no image
    assert (summary.would_index, summary.duplicates, len(summary.failures), summary.not_images) == (13, 1, 2, 1)
    assert encoder.embedded() == 0 and catalog.list_collections() == []
    real = run(catalog, encoder, folder)
    assert real.embedded == summary.would_index == 13
    (folder / "img11.jpg").unlink()
    summary = run(catalog, encoder, folder, dry_run=True, prune=True)
    # The files a run reads again (the duplicate, the bad ones) are read, but nothing would be embedded.
    assert (summary.would_index, summary.unchanged, summary.would_prune) == (0, 12, 1)
    assert len(paths(catalog)) == 13
    assert run(catalog, encoder, folder).embedded == 0 and encoder.embedded() == 13


def test_encoder_refusals_are_isolated(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(6):
        (folder / f"{i}.jpg").write_bytes(jpeg(i) + (b"REFUSE" if i == 2 else b""))  # decodable header, bad body
    summary = run(catalog, PickyEncoder(DIM), folder)
    assert summary.added == 5 and [(Path(p).name, r) for p, r in summary.failures] == [
        ("2.jpg", "the image data is corrupt or truncated")
    ]
    assert_consistent(catalog)


def test_manifests(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}.jpg").write_bytes(jpeg(i))
    manifest = tmp_path / "list.jsonl"
    rows = [
        {"path": "photos/0.jpg", "caption": "一只猫", "tags": ["cat", "pet"]},
        {"path": str(folder / "1.jpg"), "tags": ["car"]},
        {"caption": "no path"},
        {"path": "photos/missing.jpg"},
    ]
    manifest.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\nnot json\n", encoding="utf-8")
    summary = run(catalog, PickyEncoder(DIM), manifest)
    assert summary.added == 2 and len(summary.failures) == 3
    reasons = " | ".join(f"{p}: {r}" for p, r in summary.failures)
    assert "list.jsonl:3: no 'path'" in reasons and "list.jsonl:5: not JSON" in reasons and "missing.jpg" in reasons
    cat = catalog.get(paths(catalog)[str(folder / "0.jpg")])
    assert (cat.caption, cat.tags) == ("一只猫", ["cat", "pet"])

    csv_manifest = tmp_path / "list.csv"
    csv_manifest.write_text("path,caption,tags\nphotos/2.jpg,红色的车,car;red\nphotos/3.jpg,,\n", encoding="utf-8")
    summary = run(catalog, PickyEncoder(DIM), csv_manifest)
    assert summary.added == 2 and not summary.failures
    red = catalog.get(paths(catalog)[str(folder / "2.jpg")])
    assert (red.caption, red.tags) == ("红色的车", ["car", "red"])


def test_stop_then_resume_embeds_each_image_once(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(40):
        (folder / f"{i:02d}.jpg").write_bytes(jpeg(i))
    encoder = PickyEncoder(DIM)

    async def interrupted() -> IndexSummary:
        stop = asyncio.Event()

        def on_progress(summary: IndexSummary) -> None:
            if summary.added >= 8:
                stop.set()  # what the CLI's Ctrl-C handler does

        indexer = ImageIndexer(service_for(catalog, encoder), "photos", batch_size=4)
        return await indexer.run(folder, stop=stop, on_progress=on_progress)

    first = asyncio.run(interrupted())
    assert first.interrupted and 8 <= first.added < 40
    assert len(paths(catalog)) == first.added
    assert_consistent(catalog)
    second = run(catalog, encoder, folder)
    assert not second.interrupted and second.added == 40 - first.added and second.unchanged == first.added
    assert encoder.embedded() == 40 + (first.embedded - first.added)  # committed work is never redone
    assert len(paths(catalog)) == 40
    assert_consistent(catalog)
