"""Renames that reuse names (indexer/bulk/moves.py): a file whose bytes are still present under another path
is a move, whatever names the other files now have — renumbering (each name takes its neighbour's
bytes), a swap, a 3-cycle, a shift that ends on new bytes — by `cnclip index --prune`, by the pipeline
and by a watcher's pass, on SQLite and PostgreSQL. Every moved item keeps its id and its vector,
nothing is embedded again, no deletion is logged; a name whose bytes exist nowhere else is a real
change (its old item replaced, the new bytes embedded)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from cli.main import build_cli
from indexer.bulk import moves, pipeline, reading
from indexer.bulk.pipeline import ImageIndexer, IndexSummary
from indexer.bulk.sources import SourceEntry
from indexer.service.collections import CollectionService
from indexer.storage.catalog import SqlCatalog
from indexer.storage.sql.models import DeletedItemRow, ItemRow
from indexer.watch.watcher import FolderWatcher, WatchOptions
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import cli_env, jpeg, open_test_catalog, service_for

DIM = 16


def bmp(value: int) -> bytes:
    """Distinct images of one size (BMP: the size does not depend on the pixels)."""
    buffer = io.BytesIO()
    Image.new("RGB", (16, 12), (value, 40, 90)).save(buffer, "BMP")
    return buffer.getvalue()


def deletions(catalog: SqlCatalog) -> list[tuple[int, str]]:
    with Session(catalog.engine) as session:
        return [tuple(row) for row in session.execute(select(DeletedItemRow.item_id, DeletedItemRow.reason))]


def snapshot(service: CollectionService) -> dict[str, tuple[int, str]]:
    """path -> (item id, sha256) of every bulk-indexed row."""
    return {path: (state.id, state.sha256) for path, state in service.file_states("photos").items()}


def images(service: CollectionService) -> int:
    encoder = service.encoder
    assert isinstance(encoder, FakeEncoder)
    return sum(n for tower, n in encoder.calls if tower == "image")


def index(service: CollectionService, folder: Path, **options: bool) -> IndexSummary:
    return asyncio.run(ImageIndexer(service, "photos", batch_size=4).run(folder, **options))


def rotate(paths: list[Path]) -> None:
    """Renumber as photo tools do: each name takes the bytes of the next one (the last one the first's),
    by renames through a temporary name."""
    spare = paths[0].with_name(".renumbering")
    paths[0].rename(spare)
    for here, there in zip(paths, paths[1:], strict=False):
        there.rename(here)
    spare.rename(paths[-1])


def test_renumbering_by_cnclip_index_prune_keeps_every_item(
    tmp_path: Path, database_url: str, toy_model_dir: Path
) -> None:
    env = cli_env(tmp_path / "data", database_url, toy_model_dir)
    folder = tmp_path / "photos"
    folder.mkdir()
    paths = [folder / f"IMG_{n:04d}.jpg" for n in range(1, 31)]
    for n, path in enumerate(paths):
        path.write_bytes(jpeg(n))
    runner = CliRunner()
    first = runner.invoke(build_cli(), ["index", str(folder), "-c", "r", "--prune"], env=env)
    assert first.exit_code == 0, first.output
    catalog = open_test_catalog(tmp_path / "data", database_url)
    try:
        before = {sha: (item, catalog.vector(item).copy()) for sha, (_, item) in _by_sha(catalog).items()}
        rotate(paths)
        dry = runner.invoke(build_cli(), ["index", str(folder), "-c", "r", "--prune", "--dry-run"], env=env)
        assert dry.exit_code == 0, dry.output
        result = runner.invoke(build_cli(), ["index", str(folder), "-c", "r", "--prune"], env=env)
        assert result.exit_code == 0, result.output
        assert "30 renamed" in result.output and "pruned 0" in result.output, result.output
        assert "30 renamed" in dry.output and "0 rows to prune" in dry.output, dry.output
        after = _by_sha(catalog)
        assert len(after) == 30 and deletions(catalog) == []
        for n, path in enumerate(paths):  # each name holds its neighbour's bytes, and its item
            assert after[_sha(jpeg((n + 1) % 30))][0] == str(path)
        for sha, (_, item) in after.items():  # same ids, same vectors: nothing embedded again
            assert item == before[sha][0]
            assert np.array_equal(catalog.vector(item), before[sha][1])
    finally:
        catalog.close()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _by_sha(catalog: SqlCatalog) -> dict[str, tuple[str, int]]:
    """sha256 -> (path, item id) of collection "r"."""
    return {state.sha256: (path, state.id) for path, state in catalog.file_states("r").items()}


@pytest.mark.parametrize("make", [jpeg, bmp], ids=["sizes-differ", "one-size"])
def test_swap_and_three_cycle_move_items(catalog: SqlCatalog, tmp_path: Path, make: object) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    data = {name: make(n) for n, name in enumerate(["a.jpg", "b.jpg", "c.jpg", "d.jpg", "e.jpg", "f.jpg"])}  # type: ignore[operator]
    for name, content in data.items():
        (folder / name).write_bytes(content)
    service = service_for(catalog, FakeEncoder(DIM))
    assert index(service, folder).added == 6
    ids = {sha: item for _, (item, sha) in snapshot(service).items()}
    vectors = {item: catalog.vector(item).copy() for item in ids.values()}

    rotate([folder / "a.jpg", folder / "b.jpg"])  # a swap
    rotate([folder / "c.jpg", folder / "d.jpg", folder / "e.jpg"])  # a 3-cycle
    summary = index(service, folder, prune=True)

    assert (summary.renamed, summary.added, summary.changed, summary.pruned, summary.duplicates) == (5, 0, 0, 0, 0)
    assert images(service) == 6 and deletions(catalog) == []
    rows = snapshot(service)
    assert len(rows) == 6
    for path, (item, sha) in rows.items():
        assert sha == _sha(Path(path).read_bytes()) and ids[sha] == item
        assert np.array_equal(catalog.vector(item), vectors[item])
    again = index(service, folder, prune=True)  # settled: nothing left to do
    assert (again.unchanged, again.renamed, again.added) == (6, 0, 0)


def test_a_shift_that_ends_on_new_bytes_replaces_one_item(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    paths = [folder / f"IMG_{n}.bmp" for n in range(1, 6)]
    for n, path in enumerate(paths):
        path.write_bytes(bmp(n))
    service = service_for(catalog, FakeEncoder(DIM))
    index(service, folder)
    ids = {sha: item for _, (item, sha) in snapshot(service).items()}
    # IMG_1 is dropped, each later photo takes the name before it, IMG_5 is a new photo.
    for here, there in zip(paths, paths[1:], strict=False):
        here.write_bytes(there.read_bytes())
    paths[-1].write_bytes(bmp(99))
    summary = index(service, folder, prune=True)

    assert (summary.renamed, summary.added + summary.changed, summary.pruned) == (4, 1, 0)
    assert images(service) == 6  # only the new bytes were embedded
    rows = snapshot(service)
    for n, path in enumerate(paths[:-1]):
        assert rows[str(path)] == (ids[_sha(bmp(n + 1))], _sha(bmp(n + 1)))
    assert rows[str(paths[-1])][1] == _sha(bmp(99)) and rows[str(paths[-1])][0] not in ids.values()
    assert deletions(catalog) == [(ids[_sha(bmp(0))], "replaced")]  # IMG_1's bytes exist nowhere now


def test_a_dry_run_counts_what_the_run_does(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    paths = [folder / f"{n}.bmp" for n in range(4)]
    for n, path in enumerate(paths):
        path.write_bytes(bmp(n))
    service = service_for(catalog, FakeEncoder(DIM))
    index(service, folder)
    rotate(paths[:3])
    paths[3].rename(folder / "gone-and-back.bmp")  # a plain rename: not pruned either
    dry = index(service, folder, prune=True, dry_run=True)
    assert (dry.renamed, dry.would_index, dry.would_prune) == (4, 0, 0)
    real = index(service, folder, prune=True)
    assert (real.renamed, real.added, real.pruned) == (4, 0, 0) and deletions(catalog) == []


def test_a_watcher_moves_items_too(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    paths = [folder / f"IMG_{n:04d}.jpg" for n in range(1, 31)]
    for n, path in enumerate(paths):
        path.write_bytes(jpeg(n))
    service = service_for(catalog, FakeEncoder(DIM))
    passes: list[tuple[str, IndexSummary]] = []
    options = WatchOptions(quiet_s=0.2, rescan_interval_s=3600, poll_interval_s=0.2)
    watcher = FolderWatcher(
        service, "photos", folder, options, tmp_path / "data", on_pass=lambda k, s: passes.append((k, s)), batch_size=4
    )

    def settled() -> bool:
        rows = snapshot(service)
        return len(rows) == 30 and all(_sha(Path(path).read_bytes()) == sha for path, (_, sha) in rows.items())

    async def scenario() -> dict[str, int]:
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(stop))
        try:
            await _until(lambda: bool(passes) or task.done())
            ids = {sha: item for _, (item, sha) in snapshot(service).items()}
            rotate(paths)
            await _until(lambda: settled() and sum(s.renamed for _, s in passes) == 30)
            return ids
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)

    ids = asyncio.run(scenario())
    assert {sha: item for _, (item, sha) in snapshot(service).items()} == ids
    assert images(service) == 30 and deletions(catalog) == []
    assert sum(s.added + s.changed + s.pruned for _, s in passes[1:]) == 0


async def _until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"not within {timeout} s"
        await asyncio.sleep(0.05)


def test_a_pass_that_sees_one_name_of_a_swap_keeps_both_items(catalog: SqlCatalog, tmp_path: Path) -> None:
    """A watcher's hints may name one side of a swap before the other: the pass that meets A with B's
    bytes looks at B too (its recorded item's path changed), so neither item is taken for replaced."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for n, name in enumerate(["a.bmp", "b.bmp", "c.bmp"]):
        (folder / name).write_bytes(bmp(n))
    (folder / "only-a.jsonl").write_text('{"path": "a.bmp"}\n')
    service = service_for(catalog, FakeEncoder(DIM))
    index(service, folder)
    ids = {sha: item for _, (item, sha) in snapshot(service).items()}
    rotate([folder / "a.bmp", folder / "b.bmp"])
    partial = asyncio.run(ImageIndexer(service, "photos").run(folder / "only-a.jsonl"))
    assert (partial.renamed, partial.added, partial.changed) == (2, 0, 0)
    assert deletions(catalog) == [] and images(service) == 3
    for path, (item, sha) in snapshot(service).items():
        assert sha == _sha(Path(path).read_bytes()) and ids[sha] == item


def test_a_rename_over_another_name_replaces_that_names_item(catalog: SqlCatalog, tmp_path: Path) -> None:
    """`mv b a`: b's item moves to a (same id, same vector) and a's old item, whose bytes are gone, is
    replaced; one row per path."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for n, name in enumerate(["a.jpg", "b.jpg", "c.jpg"]):
        (folder / name).write_bytes(jpeg(n))
    service = service_for(catalog, FakeEncoder(DIM))
    index(service, folder)
    ids = {sha: item for _, (item, sha) in snapshot(service).items()}
    (folder / "b.jpg").replace(folder / "a.jpg")
    summary = index(service, folder, prune=True)
    assert (summary.renamed, summary.added, summary.pruned) == (1, 0, 0) and images(service) == 3
    assert snapshot(service) == {
        str(folder / "a.jpg"): (ids[_sha(jpeg(1))], _sha(jpeg(1))),
        str(folder / "c.jpg"): (ids[_sha(jpeg(2))], _sha(jpeg(2))),
    }
    assert deletions(catalog) == [(ids[_sha(jpeg(0))], "replaced")]
    with Session(catalog.engine) as session:
        assert session.scalar(select(func.count()).select_from(ItemRow)) == 2


def test_a_swap_with_one_side_unreadable_deletes_nothing(
    catalog: SqlCatalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unreadable is not deleted: when b cannot be read (EACCES), a's item (whose bytes b may hold) is
    neither replaced nor moved over; the run says so, and the next readable run settles the swap."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for n, name in enumerate(["a.bmp", "b.bmp"]):
        (folder / name).write_bytes(bmp(n))
    service = service_for(catalog, FakeEncoder(DIM))
    index(service, folder)
    ids = {sha: item for _, (item, sha) in snapshot(service).items()}
    rotate([folder / "a.bmp", folder / "b.bmp"])
    real_read = reading.read_file

    def denied(entry: SourceEntry, *args: object) -> object:
        if entry.path.name == "b.bmp":
            return str(entry.path), "cannot read: Permission denied"
        return real_read(entry, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(moves, "read_file", denied)
    monkeypatch.setattr(pipeline, "read_file", denied)
    blocked = index(service, folder, prune=True)
    assert deletions(catalog) == [] and images(service) == 2
    assert sorted(reason.split(":")[0] for _, reason in blocked.failures) == ["cannot read", "not indexed yet"]
    monkeypatch.undo()
    settled = index(service, folder, prune=True)
    assert (settled.renamed, settled.added, settled.pruned) == (2, 0, 0) and deletions(catalog) == []
    for path, (item, sha) in snapshot(service).items():
        assert sha == _sha(Path(path).read_bytes()) and ids[sha] == item


def test_two_folders_swapped_keep_their_items(catalog: SqlCatalog, tmp_path: Path) -> None:
    """Folders 2023 and 2024 (the same file names in each) swap names: every path now holds the other
    folder's bytes; every item follows its bytes."""
    folder = tmp_path / "photos"
    for year, seed in (("2023", 0), ("2024", 10)):
        (folder / year).mkdir(parents=True)
        for n in range(3):
            (folder / year / f"IMG_{n}.jpg").write_bytes(jpeg(seed + n))
    service = service_for(catalog, FakeEncoder(DIM))
    index(service, folder)
    ids = {sha: item for _, (item, sha) in snapshot(service).items()}
    (folder / "2023").rename(folder / "swap")
    (folder / "2024").rename(folder / "2023")
    (folder / "swap").rename(folder / "2024")
    summary = index(service, folder, prune=True)
    assert (summary.renamed, summary.added, summary.changed, summary.pruned) == (6, 0, 0, 0)
    assert deletions(catalog) == [] and images(service) == 6
    for path, (item, sha) in snapshot(service).items():
        assert sha == _sha(Path(path).read_bytes()) and ids[sha] == item


def test_moves_never_hold_two_rows_at_one_path_mid_transaction(catalog: SqlCatalog, tmp_path: Path) -> None:
    """Under a unique (collection, path) key (which the schema may add one day), a swap and a cycle
    still commit: every moved row leaves its path before any takes its new one."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for n in range(5):
        (folder / f"{n}.jpg").write_bytes(jpeg(n))
    service = service_for(catalog, FakeEncoder(DIM))
    index(service, folder)
    with catalog.engine.begin() as connection:
        connection.exec_driver_sql("CREATE UNIQUE INDEX ux_items_test_path ON items (collection_id, path)")
    ids = {sha: item for _, (item, sha) in snapshot(service).items()}
    rotate([folder / "0.jpg", folder / "1.jpg"])
    rotate([folder / "2.jpg", folder / "3.jpg", folder / "4.jpg"])
    summary = index(service, folder, prune=True)
    assert summary.renamed == 5 and deletions(catalog) == []
    assert {sha: item for _, (item, sha) in snapshot(service).items()} == ids


def test_a_file_edited_in_place_replaces_its_item_beside_a_renumbering(catalog: SqlCatalog, tmp_path: Path) -> None:
    """A real change (new bytes at a path no other item moves to) goes through the pipeline's replace,
    in the same run as moves by content: the edited file's old item is deleted as replaced, its new
    bytes embedded once; the renumbered ones keep their items."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for n in range(4):
        (folder / f"{n}.jpg").write_bytes(jpeg(n))
    service = service_for(catalog, FakeEncoder(DIM))
    index(service, folder)
    ids = {sha: item for _, (item, sha) in snapshot(service).items()}
    rotate([folder / "0.jpg", folder / "1.jpg", folder / "2.jpg"])
    (folder / "3.jpg").write_bytes(jpeg(30))  # edited in place: bytes that exist nowhere else
    summary = index(service, folder, prune=True)
    assert (summary.renamed, summary.changed, summary.pruned) == (3, 1, 0), summary
    assert images(service) == 5
    rows = snapshot(service)
    assert rows[str(folder / "3.jpg")][1] == _sha(jpeg(30)) and rows[str(folder / "3.jpg")][0] not in ids.values()
    assert deletions(catalog) == [(ids[_sha(jpeg(3))], "replaced")]
    assert {sha: item for _, (item, sha) in rows.items() if sha != _sha(jpeg(30))} == {
        sha: item for sha, item in ids.items() if sha != _sha(jpeg(3))
    }


def test_a_watcher_pass_replaces_nothing_while_the_folder_moves(catalog: SqlCatalog, tmp_path: Path) -> None:
    """`mv a d; mv c a` (a name reused), met by a pass whose hints name only `a` while more hints
    arrive (a rename storm): a's old item is found nowhere in that pass, but its bytes are at `d`,
    which the pass did not look at. It is not replaced (it used to be: deleted, then embedded again
    under a new id once `d` was seen); the path waits and is hinted again, and the pass that sees `d`
    moves both items."""
    from indexer.watch.passes import FolderPass
    from indexer.watch.root import PinnedRoot

    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.bmp").write_bytes(bmp(1))
    (folder / "c.bmp").write_bytes(bmp(2))
    service = service_for(catalog, FakeEncoder(DIM))
    index(service, folder)
    ids = {sha: item for _, (item, sha) in snapshot(service).items()}
    (folder / "a.bmp").rename(folder / "d.bmp")
    (folder / "c.bmp").rename(folder / "a.bmp")
    watcher_pass = FolderPass(ImageIndexer(service, "photos", batch_size=2), PinnedRoot.pin(folder))
    watcher_pass.hold_prunes = lambda: True  # hints arrived while the pass ran
    asyncio.run(watcher_pass.hinted([str(folder / "a.bmp")], asyncio.Event()))
    assert deletions(catalog) == [] and images(service) == 2
    assert str(folder / "a.bmp") in watcher_pass.deferred  # hinted again
    watcher_pass.hold_prunes = lambda: False
    paths = [str(folder / name) for name in ("a.bmp", "c.bmp", "d.bmp")]
    later = asyncio.run(watcher_pass.hinted(paths, asyncio.Event()))
    assert later.renamed == 2 and deletions(catalog) == [] and images(service) == 2
    assert {sha: item for _, (item, sha) in snapshot(service).items()} == ids
    assert snapshot(service)[str(folder / "d.bmp")] == (ids[_sha(bmp(1))], _sha(bmp(1)))
