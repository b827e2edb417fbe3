"""Issue 21, finding 2 at index time: a symlink found in an indexed folder is not followed out of it
(refused with a reason, in the report), and a file swapped for such a link after the walk is not read:
an outside file's content never reaches the catalog."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

from indexer.bulk.pipeline import ImageIndexer
from indexer.bulk.reading import read_file
from indexer.bulk.sources import walk_folder
from indexer.storage.catalog import SqlCatalog
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import jpeg, open_test_catalog, service_for

DIM = 16


def _folders(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "photos", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "a.jpg").write_bytes(jpeg(1))
    (root / "sub" / "b.jpg").write_bytes(jpeg(2))
    (outside / "secret.jpg").write_bytes(jpeg(99))
    (root / "inside-link.jpg").symlink_to(root / "sub" / "b.jpg")  # stays inside: indexed (a duplicate)
    (root / "out-link.jpg").symlink_to(outside / "secret.jpg")  # leads out: refused
    (root / "sub" / "relative-out.jpg").symlink_to(Path("..") / ".." / "outside" / "secret.jpg")
    return root, outside


def test_a_symlink_out_of_the_folder_is_refused_with_a_reason(tmp_path: Path) -> None:
    root, _ = _folders(tmp_path)
    catalog = open_test_catalog(tmp_path / "data", f"sqlite:///{tmp_path / 'catalog.db'}")
    assert isinstance(catalog, SqlCatalog)
    try:
        encoder = FakeEncoder(DIM)
        indexer = ImageIndexer(service_for(catalog, encoder), "photos", batch_size=4)
        summary = asyncio.run(indexer.run(root))
        refused = dict(summary.failures)
        assert set(refused) == {str(root.resolve() / "out-link.jpg"), str(root.resolve() / "sub" / "relative-out.jpg")}
        assert all("leads outside the indexed folder" in why for why in refused.values())
        assert (summary.added, summary.duplicates) == (2, 1)
        indexed = set(catalog.content_index("photos"))
        assert hashlib.sha256(jpeg(99)).hexdigest() not in indexed
        assert indexed == {hashlib.sha256(jpeg(n)).hexdigest() for n in (1, 2)}
    finally:
        catalog.close()


def test_a_file_swapped_for_an_outside_link_after_the_walk_is_not_read(tmp_path: Path) -> None:
    root, outside = _folders(tmp_path)
    entries, _ = walk_folder(root)
    entry = next(e for e in entries if e.path.name == "a.jpg")
    os.unlink(entry.path)
    entry.path.symlink_to(outside / "secret.jpg")
    result = read_file(entry, None)
    assert isinstance(result, tuple), "the outside file was read"
    assert result[0] == str(entry.path) and "outside" in result[1]
    swapped_folder = next(e for e in entries if e.path.name == "b.jpg")
    (root / "sub").rename(root / "sub-moved")
    (root / "sub").symlink_to(outside, target_is_directory=True)
    (outside / "b.jpg").write_bytes(jpeg(98))
    result = read_file(swapped_folder, None)
    assert isinstance(result, tuple) and "outside" in result[1]
