"""`cnclip index --dry-run --prune` counts what a real run prunes: renamed and moved files are renames,
not rows to prune (issue 28: "18 said, 1 pruned" for 17 renamed files and 1 deleted). The dry run plans
with the real run's planner (indexer/bulk/moves.py `settle_moves`, `prunable`), so the two cannot drift."""

from __future__ import annotations

import asyncio
from pathlib import Path

from indexer.bulk.pipeline import ImageIndexer, IndexSummary
from indexer.storage.catalog import SqlCatalog
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import jpeg, service_for

DIM = 16


def run(catalog: SqlCatalog, folder: Path, **kwargs: bool) -> IndexSummary:
    indexer = ImageIndexer(service_for(catalog, FakeEncoder(DIM)), "photos", batch_size=8, read_threads=2)
    return asyncio.run(indexer.run(folder, **kwargs))


def test_renamed_and_moved_files_are_not_counted_as_rows_to_prune(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    (folder / "2024").mkdir(parents=True)
    files = [folder / f"IMG_{n:04d}.jpg" for n in range(20)]
    for n, path in enumerate(files):
        path.write_bytes(jpeg(n))
    assert run(catalog, folder).added == 20
    for n, path in enumerate(files[:9]):  # renamed in place
        path.rename(folder / f"holiday-{n}.jpg")
    for path in files[9:17]:  # moved into a subfolder
        path.rename(folder / "2024" / path.name)
    files[17].unlink()  # the one file really gone

    dry = run(catalog, folder, dry_run=True, prune=True)
    assert (dry.would_prune, dry.renamed, dry.would_index) == (1, 17, 0)
    real = run(catalog, folder, prune=True)
    assert (real.pruned, real.renamed, real.added) == (1, 17, 0)
    assert run(catalog, folder, dry_run=True, prune=True).would_prune == 0  # nothing left to prune
