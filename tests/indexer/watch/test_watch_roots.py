"""What a watcher walks is the folder it was started on (indexer/watch/root.py), and a row is pruned
only when its file is really gone (indexer/fs/presence.py): the watched folder swapped for a symlink to
another folder, renamed away and back, replaced by a new folder; a file replaced by a folder; a file
still being written met by a full pass; the data dir inside the watched folder; a sub-folder made
unreadable, as a user who is not root (the suite runs as root, which ignores `chmod 000`); and the
`vectors` count of a collection another process wrote to."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from indexer.bulk.pipeline import ImageIndexer
from indexer.fs.presence import file_gone
from indexer.service.collections import CollectionService
from indexer.storage.catalog import SqlCatalog
from indexer.watch.passes import FolderPass
from indexer.watch.root import PinnedRoot, RootMoved, RootState
from indexer.watch.watcher import WatchOptions
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import jpeg, open_test_catalog, service_for
from tests.support.watching import until, watching

RESCANS = WatchOptions(quiet_s=0.2, rescan_interval_s=1.0, poll_interval_s=0.2)


def photos(folder: Path, seeds: range) -> set[str]:
    folder.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        (folder / f"{seed}.jpg").write_bytes(jpeg(seed))
    return {str(folder / f"{seed}.jpg") for seed in seeds}


def said(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


# --- the watched folder's identity ----------------------------------------------------------------------
def test_a_root_swapped_for_a_symlink_is_never_indexed_through_nor_pruned(
    any_catalog: SqlCatalog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`mv photos photos.real; ln -s /elsewhere photos`: nothing of /elsewhere is indexed, nothing of the
    real folder pruned, one line; the real folder back at its path: watched again, same items."""
    folder = tmp_path / "photos"
    mine = photos(folder, range(4))
    photos(tmp_path / "elsewhere", range(100, 103))
    service = service_for(any_catalog, FakeEncoder(dim=16))

    async def scenario() -> None:
        async with watching(service, folder, RESCANS) as w:
            ids = {path: state.id for path, state in w.rows().items()}
            assert set(ids) == mine
            folder.rename(tmp_path / "photos.real")
            folder.symlink_to(tmp_path / "elsewhere")
            (tmp_path / "elsewhere" / "new.jpg").write_bytes(jpeg(104))
            await asyncio.sleep(3.0)  # events, and rescans every second
            assert {path: state.id for path, state in w.rows().items()} == ids
            assert w.embedded() == 4
            folder.unlink()
            (tmp_path / "photos.real").rename(folder)  # the real one back: watched again
            (folder / "9.jpg").write_bytes(jpeg(9))
            await until(lambda: str(folder / "9.jpg") in w.rows(), 8)
            assert {p: s.id for p, s in w.rows().items() if p != str(folder / "9.jpg")} == ids
            assert w.embedded() == 5

    with caplog.at_level(logging.WARNING, logger="indexer.watch.watcher"):
        asyncio.run(scenario())
    assert len(said(caplog, "was replaced")) == 1
    assert len(said(caplog, "the folder is back")) == 1


def test_the_root_renamed_away_and_back(catalog: SqlCatalog, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "photos"
    mine = photos(folder, range(3))
    service = service_for(catalog, FakeEncoder(dim=16))

    async def scenario() -> None:
        async with watching(service, folder, RESCANS) as w:
            ids = {path: state.id for path, state in w.rows().items()}
            assert set(ids) == mine
            folder.rename(tmp_path / "away")
            (tmp_path / "away" / "0.jpg").unlink()  # deleted while away: seen once it is back
            await asyncio.sleep(2.5)
            assert set(w.rows()) == mine
            (tmp_path / "away").rename(folder)
            await until(lambda: str(folder / "0.jpg") not in w.rows(), 8)
            assert {p: s.id for p, s in w.rows().items()} == {p: i for p, i in ids.items() if not p.endswith("/0.jpg")}
            assert w.embedded() == 3

    with caplog.at_level(logging.WARNING, logger="indexer.watch.watcher"):
        asyncio.run(scenario())
    assert len(said(caplog, "gone or unmounted")) == 1 and len(said(caplog, "the folder is back")) == 1


def test_a_folder_above_the_root_swapped_for_a_symlink(catalog: SqlCatalog, tmp_path: Path) -> None:
    """The same swap one level up: `mv srv srv.real; ln -s /other srv`, where /other/photos exists."""
    folder = tmp_path / "srv" / "photos"
    mine = photos(folder, range(3))
    photos(tmp_path / "other" / "photos", range(100, 103))
    service = service_for(catalog, FakeEncoder(dim=16))

    async def scenario() -> None:
        async with watching(service, folder, RESCANS) as w:
            (tmp_path / "srv").rename(tmp_path / "srv.real")
            (tmp_path / "srv").symlink_to(tmp_path / "other")
            await asyncio.sleep(3.0)
            assert set(w.rows()) == mine and w.embedded() == 3

    asyncio.run(scenario())


def test_a_new_folder_put_at_the_path_is_not_adopted(
    catalog: SqlCatalog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The documented choice: a new folder at the watched path waits for a restart (said in one line);
    the old folder's items stay."""
    folder = tmp_path / "photos"
    mine = photos(folder, range(3))
    service = service_for(catalog, FakeEncoder(dim=16))

    async def scenario() -> None:
        async with watching(service, folder, RESCANS) as w:
            folder.rename(tmp_path / "photos.old")
            photos(folder, range(50, 53))
            await asyncio.sleep(3.0)
            assert set(w.rows()) == mine and w.embedded() == 3

    with caplog.at_level(logging.WARNING, logger="indexer.watch.watcher"):
        asyncio.run(scenario())
    lines = said(caplog, "was replaced")
    assert len(lines) == 1 and "restart the watcher" in lines[0]
    # A restarted watcher pins the new folder: its files are indexed, the old folder's pruned.
    asyncio.run(_one_pass(service, folder))
    assert set(service.file_states("photos")) == {str(folder / f"{seed}.jpg") for seed in range(50, 53)}


async def _one_pass(service: CollectionService, folder: Path) -> None:
    async with watching(service, folder, RESCANS):
        pass


def test_a_pass_stops_before_writing_when_the_root_is_swapped_mid_pass(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    photos(folder, range(3))
    photos(tmp_path / "elsewhere", range(100, 103))
    service = service_for(catalog, FakeEncoder(dim=16))
    root = PinnedRoot.pin(folder)

    class SwappedBeforeWriting(FolderPass):
        def _before_write(self) -> None:
            if folder.is_dir() and not folder.is_symlink():
                folder.rename(tmp_path / "photos.real")
                folder.symlink_to(tmp_path / "elsewhere")
            super()._before_write()

    with pytest.raises(RootMoved) as raised:
        pipeline = ImageIndexer(service, "photos", batch_size=2)
        asyncio.run(SwappedBeforeWriting(pipeline, root).full(asyncio.Event()))
    assert raised.value.state is RootState.REPLACED
    assert service.file_states("photos") == {}
    assert root.state() is RootState.REPLACED
    with pytest.raises(RootMoved):
        root.gone([str(folder / "0.jpg")])  # no prune decided through the link
    with pytest.raises(RootMoved):
        root.walk()


# --- presence: what is gone -----------------------------------------------------------------------------
def test_a_file_replaced_by_a_folder_is_pruned(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    photos(folder, range(3))
    service = service_for(catalog, FakeEncoder(dim=16))
    replaced = folder / "1.jpg"

    async def scenario() -> None:
        async with watching(service, folder, RESCANS) as w:
            replaced.unlink()
            replaced.mkdir()
            (replaced / "inner.jpg").write_bytes(jpeg(7))
            await until(lambda: str(replaced) not in w.rows() and str(replaced / "inner.jpg") in w.rows(), 8)

    asyncio.run(scenario())
    assert set(service.file_states("photos")) == {
        str(folder / "0.jpg"),
        str(folder / "2.jpg"),
        str(replaced / "inner.jpg"),
    }
    # `cnclip index --prune` decides by the same rule
    (folder / "2.jpg").unlink()
    (folder / "2.jpg").mkdir()
    summary = asyncio.run(ImageIndexer(service, "photos").run(folder, prune=True))
    assert summary.pruned == 1 and str(folder / "2.jpg") not in service.file_states("photos")
    assert file_gone(str(folder / "2.jpg")) and not file_gone(str(folder / "0.jpg"))


def test_a_file_still_being_written_is_not_read_by_a_full_pass(catalog: SqlCatalog, tmp_path: Path) -> None:
    """A file growing for 2.5 s, seen only by rescans (events off): read once, complete."""
    folder = tmp_path / "photos"
    folder.mkdir()
    growing = folder / "growing.jpg"
    growing.write_bytes(jpeg(1))  # a complete image that keeps growing (a JPEG ignores what follows it)
    service = service_for(catalog, FakeEncoder(dim=16))
    done = threading.Event()

    def write() -> None:
        with open(growing, "ab") as f:
            for _ in range(50):
                f.write(os.urandom(512))
                f.flush()
                time.sleep(0.05)
        done.set()

    options = WatchOptions(quiet_s=0.3, rescan_interval_s=1.0, poll_interval_s=0.2, events="off")

    async def scenario() -> None:
        writer = threading.Thread(target=write)
        writer.start()
        async with watching(service, folder, options) as w:
            await until(done.is_set, 10)
            final = hashlib.sha256(growing.read_bytes()).hexdigest()
            await until(lambda: str(growing) in w.rows() and w.full_passes() >= 1, 8)
            await asyncio.sleep(1.5)
            assert w.rows()[str(growing)].sha256 == final
            assert w.embedded() == 1  # never read half-written
        writer.join()

    asyncio.run(scenario())


def test_the_data_dir_inside_the_watched_folder_is_never_walked(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    data = folder / "cnclip-data"
    catalog = open_test_catalog(data, f"sqlite:///{data / 'catalog.db'}")
    service = service_for(catalog, FakeEncoder(dim=16))
    mine = photos(folder, range(2))
    photos(data / "media" / "ab", range(10, 13))  # upload copies, thumbnails: the product's own files
    photos(data / "thumbs", range(20, 22))
    (folder / "data-link").symlink_to(data)  # not followed anyway
    try:

        async def scenario() -> None:
            async with watching(service, folder, RESCANS, data_dir=data) as w:
                (data / "media" / "ab" / "late.jpg").write_bytes(jpeg(30))
                (folder / "new.jpg").write_bytes(jpeg(31))
                await until(lambda: str(folder / "new.jpg") in w.rows(), 8)
                await until(lambda: w.full_passes() >= 1, 8)
                assert set(w.rows()) == mine | {str(folder / "new.jpg")}

        asyncio.run(scenario())
    finally:
        catalog.close()


def test_cnclip_index_never_walks_its_own_data_dir(tmp_path: Path, toy_model_dir: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import build_cli
    from tests.support.indexer_helpers import cli_env

    folder = tmp_path / "photos"
    data = folder / "cnclip-data"
    mine = photos(folder, range(2))
    photos(data / "media" / "ab", range(10, 13))
    photos(data / "thumbs", range(20, 22))
    env = cli_env(data, f"sqlite:///{data / 'catalog.db'}", toy_model_dir)
    result = CliRunner().invoke(build_cli(), ["index", str(folder), "-c", "photos"], env=env)
    assert result.exit_code == 0, result.output
    catalog = open_test_catalog(data, f"sqlite:///{data / 'catalog.db'}")
    try:
        assert set(catalog.file_states("photos")) == mine
    finally:
        catalog.close()


# --- unreadable is not deleted (as a user who is not root) ---------------------------------------------
def _as_nobody(folder: str, data: str, results: Any) -> None:
    """The child (spawned: forking the suite's threads could leave a lock held): every import made
    as root (a watcher's run on a throwaway folder), then drop to `nobody`, watch, lock a sub-folder
    with a new file in it, unlock it."""
    warm = Path(tempfile.mkdtemp(prefix="cnclip-warm-"))
    warmed = open_test_catalog(warm / "data", f"sqlite:///{warm / 'data' / 'catalog.db'}")
    photos(warm / "photos", range(1))
    asyncio.run(_one_pass(service_for(warmed, FakeEncoder(dim=16)), warm / "photos"))
    warmed.close()
    shutil.rmtree(warm)
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logging.getLogger("indexer.watch.watcher").addHandler(Collect())
    logging.getLogger("indexer.watch.watcher").setLevel(logging.WARNING)
    top = Path(folder)
    catalog = open_test_catalog(Path(data), f"sqlite:///{data}/catalog.db")
    service = service_for(catalog, FakeEncoder(dim=16))
    report: dict[str, Any] = {}

    async def scenario() -> None:
        async with watching(service, top, WatchOptions(quiet_s=0.2, rescan_interval_s=1.0), Path(data)) as w:
            report["first"] = sorted(w.rows())
            (top / "locked" / "new.jpg").write_bytes(jpeg(40))
            os.chmod(top / "locked", 0)
            hinted = sum(1 for kind, _ in w.passes if kind == "hinted")
            w.watcher._hint({str(top / "locked" / "new.jpg")})  # the event a root-owned inotify would send
            await until(lambda: sum(1 for kind, _ in w.passes if kind == "hinted") > hinted, 30)
            (top / "top-new.jpg").write_bytes(jpeg(41))  # the watcher keeps watching
            await until(lambda: str(top / "top-new.jpg") in w.rows(), 30)
            full = w.full_passes()
            await until(lambda: w.full_passes() >= full + 2, 30)
            report["locked"] = sorted(w.rows())
            os.chmod(top / "locked", 0o755)
            await until(lambda: str(top / "locked" / "new.jpg") in w.rows(), 30)
            report["unlocked"] = sorted(w.rows())

    try:
        asyncio.run(scenario())
        report["lines"] = lines
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test with it
        report["error"] = f"{traceback.format_exc()} {lines}"
    finally:
        catalog.close()
    results.put(report)


@pytest.fixture
def nobodys_dir() -> Iterator[Path]:
    """A temp dir `nobody` can reach (pytest's own are private to root)."""
    if os.getuid() != 0:
        pytest.fail("the suite runs as root: this test drops to nobody to make chmod 000 bite")
    made = Path(tempfile.mkdtemp(prefix="cnclip-nobody-", dir="/tmp"))
    os.chmod(made, 0o755)
    yield made
    shutil.rmtree(made)


def test_an_unreadable_folder_is_skipped_not_pruned_as_a_user_who_is_not_root(nobodys_dir: Path) -> None:
    folder, data = nobodys_dir / "photos", nobodys_dir / "data"
    top = photos(folder, range(2))
    locked = photos(folder / "locked", range(10, 14))
    data.mkdir()
    for path in [folder, folder / "locked", data, *map(Path, top | locked)]:
        os.chown(path, 65534, 65534)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_as_nobody, args=(str(folder), str(data), results))
    child.start()
    report = results.get(timeout=180)
    child.join(30)
    assert "error" not in report, report.get("error")
    assert report["first"] == sorted(top | locked)
    assert report["locked"] == sorted(top | locked | {str(folder / "top-new.jpg")})  # nothing under locked/ pruned
    assert report["unlocked"] == sorted(
        top | locked | {str(folder / "top-new.jpg"), str(folder / "locked" / "new.jpg")}
    )
    warned = [line for line in report["lines"] if "cannot read" in line]
    assert len(warned) == 1 and str(folder / "locked") in warned[0], report["lines"]


# --- the vectors count --------------------------------------------------------------------------------------
def test_the_vectors_count_follows_other_processes_commits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'data' / 'catalog.db'}"
    server = open_test_catalog(tmp_path / "data", url)
    other = open_test_catalog(tmp_path / "data", url)  # another process's catalog (`cnclip index`)
    try:
        photos(tmp_path / "a", range(5))
        photos(tmp_path / "b", range(100, 145))
        asyncio.run(ImageIndexer(service_for(server, FakeEncoder(dim=16)), "photos").run(tmp_path / "a"))
        server.store("photos")  # the server holds the collection's store (as after a search)
        assert server.get_collection("photos").vectors == 5
        asyncio.run(ImageIndexer(service_for(other, FakeEncoder(dim=16)), "photos").run(tmp_path / "b"))
        info = server.get_collection("photos")
        assert (info.items, info.vectors) == (50, 50)
    finally:
        other.close()
        server.close()


def test_every_way_the_root_stops_being_the_pinned_folder(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    photos(folder, range(1))
    root = PinnedRoot.pin(folder)
    assert root.state() is RootState.HERE
    folder.rename(tmp_path / "real")
    assert root.state() is RootState.GONE
    folder.symlink_to(tmp_path / "real")  # a link back to the very same folder is still a replacement
    assert root.state() is RootState.REPLACED
    folder.unlink()
    folder.write_bytes(b"a file now")
    assert root.state() is RootState.REPLACED
    folder.unlink()
    (tmp_path / "real").rename(folder)
    assert root.state() is RootState.HERE
    found, _ = root.walk()
    assert [str(e.path) for e in found.entries] == [str(folder / "0.jpg")]


# --- unreadable is not missing: other ways (an I/O error, a file without read permission) -----------------
def test_an_io_error_is_not_a_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EIO (a failing disk, a stale mount) when a file is opened: `cannot read`, never `missing` —
    for indexing (indexer/bulk/moves.py keeps a displaced item whose bytes such a file may hold) and for
    serving (404 saying so); presence still says the file is there."""
    import errno

    from indexer.bulk.reading import read_file
    from indexer.bulk.sources import SourceEntry
    from indexer.domain.records import ItemRecord
    from indexer.storage.media.check import read_media
    from retrieval.errors import NotFound

    folder = tmp_path / "photos"
    photos(folder, range(1))
    sick = folder / "0.jpg"
    real_open = os.open

    def failing(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path) == sick.name:
            raise OSError(errno.EIO, "Input/output error")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing)
    read = read_file(SourceEntry(sick, root=folder), None)
    assert isinstance(read, tuple) and read[1] == "cannot read: Input/output error", read
    record = ItemRecord(1, "photos", "images", path=str(sick), root=str(folder), sha256="0" * 64, size=1)
    with pytest.raises(NotFound, match="cannot be read"):
        read_media(record, tmp_path / "media")
    monkeypatch.undo()
    assert not file_gone(str(sick))


def test_a_watcher_survives_a_folder_that_cannot_be_listed(
    catalog: SqlCatalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The watched folder's own listing fails (EIO) for a few passes: said once, nothing pruned, and
    the watcher keeps watching (it used to die with the `OSError`)."""
    import errno

    folder = tmp_path / "photos"
    mine = photos(folder, range(3)) | photos(folder / "sub", range(10, 12))
    service = service_for(catalog, FakeEncoder(dim=16))
    real_scandir = os.scandir
    sick = threading.Event()

    def failing(path: Any = None) -> Any:
        if sick.is_set():
            raise OSError(errno.EIO, "Input/output error")
        return real_scandir(path) if path is not None else real_scandir()

    monkeypatch.setattr(os, "scandir", failing)

    async def scenario() -> None:
        async with watching(service, folder, RESCANS) as w:
            assert set(w.rows()) == mine
            sick.set()
            full = w.full_passes()
            await until(lambda: w.full_passes() >= full + 2, 10)
            assert set(w.rows()) == mine
            sick.clear()
            (folder / "after.jpg").write_bytes(jpeg(50))
            await until(lambda: str(folder / "after.jpg") in w.rows(), 10)

    with caplog.at_level(logging.WARNING, logger="indexer.watch.watcher"):
        asyncio.run(scenario())
    assert len(said(caplog, "Input/output error")) == 1


def _index_as_nobody(top: str, data: str, results: Any) -> None:
    """The child of the test below: warm the imports as root, drop to `nobody`, index, lock, index."""
    warm = Path(tempfile.mkdtemp(prefix="cnclip-warm-"))
    warmed = open_test_catalog(warm / "data", f"sqlite:///{warm / 'data' / 'catalog.db'}")
    photos(warm / "photos", range(1))
    asyncio.run(ImageIndexer(service_for(warmed, FakeEncoder(dim=16)), "photos").run(warm / "photos", prune=True))
    warmed.close()
    shutil.rmtree(warm)
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    folder = Path(top)
    catalog = open_test_catalog(Path(data), f"sqlite:///{data}/catalog.db")
    service = service_for(catalog, FakeEncoder(dim=16))
    report: dict[str, Any] = {}
    try:
        first = asyncio.run(ImageIndexer(service, "photos").run(folder, prune=True))
        report["first"] = (sorted(service.file_states("photos")), first.failures)
        ids = {path: state.id for path, state in service.file_states("photos").items()}
        # a and b swap names (their sizes differ), and b cannot be read; two folders lose permissions
        (folder / "a.jpg").rename(folder / "t.jpg")
        (folder / "b.jpg").rename(folder / "a.jpg")
        (folder / "t.jpg").rename(folder / "b.jpg")
        os.chmod(folder / "b.jpg", 0)
        os.chmod(folder / "listable", 0o400)  # names can be listed, not looked at
        os.chmod(folder / "locked", 0)
        locked = asyncio.run(ImageIndexer(service, "photos").run(folder, prune=True))
        report["locked"] = ({p: s.id for p, s in service.file_states("photos").items()} == ids, locked.failures)
        report["deletions_locked"] = locked.pruned
        for path, mode in ((folder / "b.jpg", 0o644), (folder / "listable", 0o755), (folder / "locked", 0o755)):
            os.chmod(path, mode)
        settled = asyncio.run(ImageIndexer(service, "photos").run(folder, prune=True))
        now = {p: s.id for p, s in service.file_states("photos").items()}
        report["settled"] = (
            settled.renamed,
            now[str(folder / "a.jpg")] == ids[str(folder / "b.jpg")],
            sorted(now.values()) == sorted(ids.values()),
        )
    except BaseException:  # noqa: BLE001 - reported to the parent
        report["error"] = traceback.format_exc()
    finally:
        catalog.close()
    results.put(report)


def test_cnclip_index_as_a_user_who_is_not_root_keeps_what_it_cannot_read(nobodys_dir: Path) -> None:
    """`cnclip index --prune` as `nobody`: a swap whose one side is `chmod 000` deletes nothing (an
    unreadable file is not a missing one), a folder that can be listed but not searched (0400) and a
    `chmod 000` folder are said (`cannot read`), not a traceback, and nothing under them is pruned;
    once readable, the swap settles by content."""
    folder, data = nobodys_dir / "photos", nobodys_dir / "data"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(jpeg(1, (24, 16)))
    (folder / "b.jpg").write_bytes(jpeg(2, (40, 16)))
    made = photos(folder / "listable", range(10, 12)) | photos(folder / "locked", range(20, 22))
    data.mkdir()
    for path in [
        folder,
        folder / "listable",
        folder / "locked",
        data,
        folder / "a.jpg",
        folder / "b.jpg",
        *map(Path, made),
    ]:
        os.chown(path, 65534, 65534)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_index_as_nobody, args=(str(folder), str(data), results))
    child.start()
    report = results.get(timeout=180)
    child.join(30)
    assert "error" not in report, report.get("error")
    assert len(report["first"][0]) == 6 and report["first"][1] == []
    kept, failures = report["locked"]
    assert kept and report["deletions_locked"] == 0, report
    said_about: dict[str, list[str]] = {}
    for path, why in failures:
        said_about.setdefault(Path(path).name, []).append(why.split(";")[0])
    assert said_about["b.jpg"] and all(
        why.startswith(("cannot read", "not indexed yet")) for why in said_about["b.jpg"]
    )
    assert said_about["locked"] == said_about["10.jpg"] == said_about["11.jpg"] == ["cannot read: Permission denied"]
    assert report["settled"] == (2, True, True), report


@pytest.mark.parametrize("away", ["symlinked", "parent-symlinked", "renamed-away"])
def test_cnclip_index_prune_keeps_the_rows_of_a_folder_that_is_away(
    any_catalog: SqlCatalog, tmp_path: Path, away: str
) -> None:
    """`cnclip index --prune` prunes the rows of every folder of the collection whose files are gone,
    but a folder that is itself away is not a folder whose files were all deleted: swapped for a
    symlink to another folder (itself or one above it: `mv srv srv.real; ln -s /other srv`), or
    renamed away / unmounted, while another folder of the collection is indexed with `--prune`.
    Its rows stay (they used to be pruned, and embedded again under new ids once it was back)."""
    service = service_for(any_catalog, FakeEncoder(dim=16))
    folder = tmp_path / "srv" / "photos"
    mine = photos(folder, range(3))
    other = photos(tmp_path / "other", range(10, 12))
    photos(tmp_path / "elsewhere" / "photos", range(100, 102))
    asyncio.run(ImageIndexer(service, "photos").run(folder, prune=True))
    asyncio.run(ImageIndexer(service, "photos").run(tmp_path / "other", prune=True))
    ids = {path: state.id for path, state in service.file_states("photos").items()}
    assert set(ids) == mine | other
    if away == "symlinked":
        folder.rename(tmp_path / "srv" / "photos.real")
        folder.symlink_to(tmp_path / "elsewhere" / "photos")
    elif away == "parent-symlinked":
        (tmp_path / "srv").rename(tmp_path / "srv.real")
        (tmp_path / "srv").symlink_to(tmp_path / "elsewhere")
    else:
        folder.rename(tmp_path / "srv" / "unmounted")
        folder.mkdir()  # an empty mount point
        folder.rmdir()
    (tmp_path / "other" / "10.jpg").unlink()  # a file really deleted from a folder that is here
    summary = asyncio.run(ImageIndexer(service, "photos").run(tmp_path / "other", prune=True))
    assert summary.pruned == 1
    assert {path: state.id for path, state in service.file_states("photos").items()} == {
        path: item for path, item in ids.items() if not path.endswith("/10.jpg")
    }


def test_an_io_error_opening_the_root_is_unreadable_not_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO opening the watched folder says nothing of what is at its path: the pass stops as for an
    unreadable folder (it used to say `replaced`, whose line asks for a restart)."""
    import errno

    folder = tmp_path / "photos"
    photos(folder, range(1))
    root = PinnedRoot.pin(folder)
    real_open = os.open

    def failing(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path) == str(folder):
            raise OSError(errno.EIO, "Input/output error")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing)
    with pytest.raises(RootMoved) as raised:
        root.walk()
    assert raised.value.state is RootState.UNREADABLE
    with pytest.raises(RootMoved) as raised:
        root.gone([str(folder / "0.jpg")])
    assert raised.value.state is RootState.UNREADABLE
