"""Watched folders in-process (indexer/watch/watcher.py) with the fake encoder: add, rename, move, edit, delete,
a half-written file, a missed event caught by the rescan, polling, the inotify fallback, hidden files,
two watchers of one folder, a folder that goes away, the quiet period, and `CNCLIP_WATCH` parsing."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from indexer.storage.catalog import SqlCatalog
from indexer.watch.debounce import QuietPaths
from indexer.watch.events import changed_paths, filesystem_type, needs_polling, snapshot
from indexer.watch.settings import parse_watch_setting
from indexer.watch.watcher import WatchOptions
from retrieval.fake import FakeEncoder
from tests.support.indexer_helpers import jpeg, open_test_catalog, service_for
from tests.support.watching import Watching, until, watching

FAST = WatchOptions(quiet_s=0.2, rescan_interval_s=3600, poll_interval_s=0.2)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_add_rename_move_edit_delete(any_catalog: SqlCatalog, tmp_path: Path) -> None:
    catalog = any_catalog
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(jpeg(1))
    (folder / "b.jpg").write_bytes(jpeg(2))
    service = service_for(catalog, FakeEncoder(dim=16))

    async def scenario() -> None:
        async with watching(service, folder, FAST) as w:
            assert w.passes[0][0] == "first" and w.passes[0][1].added == 2
            a_id = w.rows()[str(folder / "a.jpg")].id
            vector = catalog.vector(a_id).copy()

            (folder / "c.jpg").write_bytes(jpeg(3))  # add
            took = await until(lambda: str(folder / "c.jpg") in w.rows())
            assert took < 5 and w.embedded() == 3

            (folder / "a.jpg").rename(folder / "a2.jpg")  # rename: same id, same vector, nothing embedded
            await until(lambda: str(folder / "a2.jpg") in w.rows() and str(folder / "a.jpg") not in w.rows())
            assert w.rows()[str(folder / "a2.jpg")].id == a_id and w.embedded() == 3

            (folder / "sub").mkdir()  # move into a new subfolder
            (folder / "a2.jpg").rename(folder / "sub" / "a2.jpg")
            await until(lambda: str(folder / "sub" / "a2.jpg") in w.rows() and len(w.rows()) == 3)
            (folder / "sub").rename(folder / "album")  # a whole folder moved
            await until(lambda: str(folder / "album" / "a2.jpg") in w.rows() and len(w.rows()) == 3)
            assert w.rows()[str(folder / "album" / "a2.jpg")].id == a_id and w.embedded() == 3
            assert (catalog.vector(a_id) == vector).all()

            (folder / "b.jpg").write_bytes(jpeg(20))  # edited in place: re-embedded, one row at the path
            await until(lambda: w.rows()[str(folder / "b.jpg")].sha256 == sha(jpeg(20)))
            assert w.embedded() == 4 and len(w.rows()) == 3

            (folder / "c.jpg").unlink()  # deleted: pruned, and not remembered as a user's deletion
            await until(lambda: str(folder / "c.jpg") not in w.rows())
            assert service.remembered_deletions("photos") == set()
            (folder / "c2.jpg").write_bytes(jpeg(3))  # the same bytes come back: indexed again
            await until(lambda: str(folder / "c2.jpg") in w.rows())
            assert sorted(catalog.index_ids("photos")) == sorted(s.id for s in w.rows().values())

    asyncio.run(scenario())


def test_half_written_file_is_read_once_complete(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    service = service_for(catalog, FakeEncoder(dim=16))
    data = jpeg(7, (64, 64))
    options = WatchOptions(quiet_s=0.8, rescan_interval_s=3600)

    async def scenario() -> None:
        async with watching(service, folder, options) as w:
            with open(folder / "slow.jpg", "wb") as f:
                f.write(data[: len(data) // 2])
                f.flush()
                await asyncio.sleep(0.4)  # shorter than the quiet period
                f.write(data[len(data) // 2 :])
            await until(lambda: str(folder / "slow.jpg") in w.rows())
            await asyncio.sleep(1.0)
            assert w.rows()[str(folder / "slow.jpg")].sha256 == sha(data)
            assert w.embedded() == 1  # read once, complete
            assert all(not summary.failures for _, summary in w.passes)

    asyncio.run(scenario())


def test_a_writer_pausing_longer_than_the_quiet_period_ends_with_one_complete_row(
    catalog: SqlCatalog, tmp_path: Path
) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    service = service_for(catalog, FakeEncoder(dim=16))
    data = jpeg(8, (64, 64))

    async def scenario() -> None:
        async with watching(service, folder, FAST) as w:
            with open(folder / "stalled.jpg", "wb") as f:
                f.write(data[: len(data) // 2])
                f.flush()
                await asyncio.sleep(1.0)  # five quiet periods: the partial file is read as it is
                f.write(data[len(data) // 2 :])
            await until(
                lambda: (
                    w.rows().get(str(folder / "stalled.jpg")) is not None
                    and w.rows()[str(folder / "stalled.jpg")].sha256 == sha(data)
                )
            )
            assert len(w.rows()) == 1  # the partial one was replaced, not kept beside it

    asyncio.run(scenario())


def test_a_file_created_before_the_events_are_ready_is_caught_soon(catalog: SqlCatalog, tmp_path: Path) -> None:
    """A file that arrives after the first pass walked the folder but before the event source could
    report it (here: no events at all) is indexed by the early rescan, not after the long interval."""
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "old.jpg").write_bytes(jpeg(1))
    service = service_for(catalog, FakeEncoder(dim=16))
    options = WatchOptions(quiet_s=0.2, rescan_interval_s=600.0, events="off")

    async def scenario() -> None:
        async with watching(service, folder, options) as w:
            await until(lambda: len(w.passes) == 1, 4)
            (folder / "new.jpg").write_bytes(jpeg(2))
            # Within seconds, not the 600 s interval; the pass reports after its commit, so wait for both.
            await until(lambda: str(folder / "new.jpg") in w.rows() and len(w.passes) == 2, 15)
            assert [kind for kind, _ in w.passes] == ["first", "full"]

    asyncio.run(scenario())


def test_a_missed_event_is_caught_by_the_rescan(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "old.jpg").write_bytes(jpeg(1))
    service = service_for(catalog, FakeEncoder(dim=16))
    options = WatchOptions(quiet_s=0.2, rescan_interval_s=1.0, events="off")  # no events at all: rescans only

    async def scenario() -> None:
        async with watching(service, folder, options) as w:
            assert w.watcher.mode == "rescans only"
            (folder / "new.jpg").write_bytes(jpeg(2))
            (folder / "old.jpg").unlink()
            await until(lambda: set(w.rows()) == {str(folder / "new.jpg")} and len(w.passes) > 1, 4)
            assert {kind for kind, _ in w.passes} == {"first", "full"}

    asyncio.run(scenario())


def test_polling_sees_adds_and_renames(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(jpeg(1))
    service = service_for(catalog, FakeEncoder(dim=16))
    options = WatchOptions(quiet_s=0.2, rescan_interval_s=3600, poll_interval_s=0.2, events="poll")

    async def scenario() -> None:
        async with watching(service, folder, options) as w:
            first_id = w.rows()[str(folder / "a.jpg")].id
            (folder / "a.jpg").rename(folder / "renamed.jpg")  # polling sees delete + create: still a rename
            (folder / "b.jpg").write_bytes(jpeg(2))
            await until(lambda: set(w.rows()) == {str(folder / "renamed.jpg"), str(folder / "b.jpg")})
            assert w.rows()[str(folder / "renamed.jpg")].id == first_id and w.embedded() == 2
            assert w.watcher.mode == "polling"

    asyncio.run(scenario())


def test_inotify_failure_falls_back_to_polling_with_one_line(
    catalog: SqlCatalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    service = service_for(catalog, FakeEncoder(dim=16))

    async def limit_reached(top: Path, stop: asyncio.Event) -> AsyncIterator[set[str]]:
        raise OSError("OS file watch limit reached.")
        yield set()  # an async generator, as the real one

    monkeypatch.setattr("indexer.watch.watcher.inotify_hints", limit_reached)

    async def scenario() -> None:
        async with watching(service, folder, FAST) as w:
            (folder / "a.jpg").write_bytes(jpeg(1))
            await until(lambda: str(folder / "a.jpg") in w.rows())
            assert w.watcher.mode == "polling"

    with caplog.at_level(logging.WARNING, logger="indexer.watch.watcher"):
        asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records if "inotify cannot watch" in r.getMessage()]
    assert len(lines) == 1 and "OS file watch limit reached" in lines[0] and "polling every 0.2 s" in lines[0]


def test_a_name_that_is_not_utf8_is_indexed_and_polling_takes_over(
    catalog: SqlCatalog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    service = service_for(catalog, FakeEncoder(dim=16))
    name = os.fsdecode(os.fsencode(str(folder)) + b"/img-\xff.jpg")  # watchfiles cannot decode it

    async def scenario() -> None:
        async with watching(service, folder, FAST) as w:
            assert w.watcher.mode == "inotify"
            with open(os.fsencode(name), "wb") as f:
                f.write(jpeg(1))
            await until(lambda: name in w.rows())
            (folder / "after.jpg").write_bytes(jpeg(2))  # seen by polling now
            await until(lambda: str(folder / "after.jpg") in w.rows())
            assert w.watcher.mode == "polling"

    with caplog.at_level(logging.WARNING, logger="indexer.watch.watcher"):
        asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records if "inotify cannot watch" in r.getMessage()]
    assert len(lines) == 1 and "decode" in lines[0], lines


def test_an_event_source_that_breaks_unexpectedly_is_said_and_rescans_go_on(
    catalog: SqlCatalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    service = service_for(catalog, FakeEncoder(dim=16))

    async def broken(top: Path, stop: asyncio.Event) -> AsyncIterator[set[str]]:
        raise ValueError("a bug in the event source")
        yield set()

    monkeypatch.setattr("indexer.watch.watcher.inotify_hints", broken)

    async def scenario() -> None:
        async with watching(service, folder, WatchOptions(quiet_s=0.2, rescan_interval_s=1.0)) as w:
            (folder / "a.jpg").write_bytes(jpeg(1))
            await until(lambda: str(folder / "a.jpg") in w.rows())
            assert w.watcher.mode == "rescans only"

    with caplog.at_level(logging.WARNING, logger="indexer.watch.watcher"):
        asyncio.run(scenario())
    assert any("the event source failed (ValueError('a bug" in r.getMessage() for r in caplog.records)


def test_hidden_files_and_links_out_are_ignored_as_by_index(catalog: SqlCatalog, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    outside = tmp_path / "outside.jpg"
    outside.write_bytes(jpeg(9))
    service = service_for(catalog, FakeEncoder(dim=16))

    async def scenario() -> None:
        async with watching(service, folder, FAST) as w:
            (folder / ".hidden.jpg").write_bytes(jpeg(1))
            (folder / ".cache").mkdir()
            (folder / ".cache" / "in-hidden-folder.jpg").write_bytes(jpeg(2))
            (folder / "notes.txt").write_text("not an image")
            (folder / "out.jpg").symlink_to(outside)
            (folder / "seen.jpg").write_bytes(jpeg(3))
            await until(lambda: str(folder / "seen.jpg") in w.rows())
            await asyncio.sleep(0.5)
            assert set(w.rows()) == {str(folder / "seen.jpg")}
            (folder / "seen.jpg").rename(folder / ".seen.jpg")  # hidden now: pruned, as `index --prune` would
            await until(lambda: not w.rows())
            refusals = [f for _, s in w.passes for f in s.failures]
            assert refusals and all("symlink that leads outside" in why for _, why in refusals)

    asyncio.run(scenario())


def test_two_watchers_of_one_folder(catalog: SqlCatalog, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(jpeg(1))
    service = service_for(catalog, FakeEncoder(dim=16))
    data = tmp_path / "data"

    async def scenario() -> None:
        async with watching(service, folder, FAST, data_dir=data) as first:
            second = Watching(service, folder, FAST, data)
            task = asyncio.create_task(second.watcher.run(second.stop))
            await asyncio.sleep(0.5)
            assert not second.passes  # standing by
            (folder / "b.jpg").write_bytes(jpeg(2))
            await until(lambda: len(first.rows()) == 2)
        # The first one stopped: the second takes over and catches up.
        (folder / "c.jpg").write_bytes(jpeg(3))
        await until(lambda: bool(second.passes) and len(second.rows()) == 3, 10)
        (folder / "d.jpg").write_bytes(jpeg(4))
        await until(lambda: len(second.rows()) == 4)
        second.stop.set()
        await asyncio.wait_for(task, 10)
        shas = [s.sha256 for s in second.rows().values()]
        assert len(shas) == len(set(shas)) == 4

    with caplog.at_level(logging.WARNING, logger="indexer.watch.watcher"):
        asyncio.run(scenario())
    standby = [r.getMessage() for r in caplog.records if "standing by" in r.getMessage()]
    assert len(standby) == 1 and f"pid {os.getpid()}" in standby[0]


def test_a_folder_that_goes_away_prunes_nothing(
    catalog: SqlCatalog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.jpg").write_bytes(jpeg(i))
    service = service_for(catalog, FakeEncoder(dim=16))
    options = WatchOptions(quiet_s=0.2, rescan_interval_s=1.0)

    async def scenario() -> None:
        async with watching(service, folder, options) as w:
            folder.rename(tmp_path / "unmounted")
            await asyncio.sleep(2.0)  # events and a rescan while it is gone
            assert len(w.rows()) == 3
            (tmp_path / "unmounted").rename(folder)  # back: the same folder (device and inode) at its path
            await until(lambda: any(kind == "full" for kind, _ in w.passes), 8)  # the rescan when it is back
            w.watcher.options = WatchOptions(quiet_s=0.2, rescan_interval_s=3600)  # events alone from now on
            await asyncio.sleep(2.0)
            (folder / "0.jpg").unlink()
            await until(lambda: len(w.rows()) == 2, 5)  # seen by the events of the folder's new watches

    with caplog.at_level(logging.WARNING, logger="indexer.watch.watcher"):
        asyncio.run(scenario())
    assert any("gone or unmounted; nothing is pruned" in r.getMessage() for r in caplog.records)


# --- the parts ----------------------------------------------------------------------------------------
def test_quiet_paths_wait_for_a_still_file() -> None:
    signatures = {"/f": (1, 1, 1)}
    quiet = QuietPaths(1.0, stat=lambda path: signatures.get(path))
    quiet.hint("/f", now=0.0)
    assert quiet.settled(0.5) == [] and quiet.next_due(0.5) == 0.5
    signatures["/f"] = (2, 2, 1)  # still growing when its quiet period ends: wait again
    assert quiet.settled(1.0) == []
    assert quiet.settled(1.5) == [] and quiet.settled(2.0) == ["/f"] and len(quiet) == 0
    quiet.hint("/gone", now=3.0)  # a deleted path settles too (its prune)
    assert quiet.settled(4.0) == ["/gone"]
    quiet.hint("/f", now=5.0)
    quiet.hint("/f", now=5.9)  # another hint restarts the wait
    assert quiet.settled(6.5) == [] and quiet.settled(6.9) == ["/f"]
    never = QuietPaths(1.0, longest_s=3.0, stat=lambda path: (time.monotonic_ns(), 0, 0))
    never.hint("/log", now=0.0)
    assert never.settled(1.0) == [] and never.settled(2.0) == [] and never.settled(3.1) == ["/log"]


def test_snapshots_skip_hidden_and_see_changes(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(b"1")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.jpg").write_bytes(b"1")
    before = snapshot(tmp_path)
    assert set(before) == {str(tmp_path / "a.jpg")}
    (tmp_path / "a.jpg").rename(tmp_path / "b.jpg")
    assert changed_paths(before, snapshot(tmp_path)) == {str(tmp_path / "a.jpg"), str(tmp_path / "b.jpg")}


def test_network_filesystems_are_polled(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 0:50 / /mnt/nas rw,relatime shared:20 - nfs4 nas:/photos rw\n"
        "41 22 0:51 / /mnt/my\\040drive rw - fuse.sshfs host: rw\n"
    )
    assert filesystem_type(Path("/mnt/nas/2024/a"), str(mountinfo)) == "nfs4"
    assert filesystem_type(Path("/mnt/nasty"), str(mountinfo)) == "ext4"
    assert filesystem_type(Path("/mnt/my drive/x"), str(mountinfo)) == "fuse.sshfs"
    assert needs_polling("nfs4") and needs_polling("fuse.sshfs") and needs_polling("cifs")
    assert not needs_polling("ext4") and not needs_polling(None)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("/srv/photos=photos", "not JSON"),
        ('["/srv/photos"]', "must be a JSON object"),
        ('{"photos": "photos"}', "give an absolute folder"),
        ('{"/srv/photos": "bad name!"}', "letters"),
        ('{"/srv/photos": 3}', "the collection must be a string"),
        ('{"": "photos"}', "non-empty"),
        ('{"/srv/a\\u0000b": "photos"}', "NUL"),
        ('{"/srv/photos": "p", "/srv/photos/": "q"}', "listed twice"),
        ('{"/srv/photos": "p", "/srv/photos/2024": "P"}', "nested"),
    ],
)
def test_bad_watch_settings_say_what_is_wrong(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_watch_setting(value)


def test_good_watch_settings() -> None:
    home = os.path.expanduser("~")
    parsed = parse_watch_setting('{"~/Pictures": "photos", "/srv/photos/2024": "year", "/srv/photos": "photos"}')
    assert parsed == {f"{home}/Pictures": "photos", "/srv/photos/2024": "year", "/srv/photos": "photos"}
    assert parse_watch_setting("") == {} and parse_watch_setting({}) == {}


def test_the_watch_lock_is_released_on_exit(tmp_path: Path) -> None:
    from indexer.watch.lock import FolderLock

    first = FolderLock(tmp_path, "photos", tmp_path / "f")
    second = FolderLock(tmp_path, "PHOTOS", tmp_path / "f")  # names are case-insensitive
    other = FolderLock(tmp_path, "photos", tmp_path / "g")
    assert first.try_acquire() and not second.try_acquire() and other.try_acquire()
    assert second.holder() == str(os.getpid())
    first.release()
    assert second.try_acquire()
    second.release()
    other.release()
    shutil.rmtree(tmp_path)


def test_rows_outside_the_watched_folder_are_left_alone(catalog: SqlCatalog, tmp_path: Path) -> None:
    from indexer.bulk.pipeline import ImageIndexer

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.jpg").write_bytes(jpeg(50))
    service = service_for(catalog, FakeEncoder(dim=16))
    asyncio.run(ImageIndexer(service, "photos").run(elsewhere))
    (elsewhere / "x.jpg").unlink()  # gone, but not from the watched folder: not the watcher's to prune
    folder = tmp_path / "photos"
    folder.mkdir()
    options = WatchOptions(quiet_s=0.2, rescan_interval_s=1.0)

    async def scenario() -> None:
        async with watching(service, folder, options) as w:
            (folder / "a.jpg").write_bytes(jpeg(1))
            await until(lambda: len(w.passes) >= 3, 5)  # the first pass, a hinted one, a rescan
            assert set(w.rows()) == {str(elsewhere / "x.jpg"), str(folder / "a.jpg")}

    asyncio.run(scenario())


def test_the_catalogs_own_files_inside_the_folder_start_no_passes(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    data = folder / "cnclip-data"  # the data dir inside the watched folder: every commit writes there
    catalog = open_test_catalog(data, f"sqlite:///{data / 'catalog.db'}")
    service = service_for(catalog, FakeEncoder(dim=16))
    try:

        async def scenario() -> None:
            async with watching(service, folder, FAST, data_dir=data) as w:
                (folder / "a.jpg").write_bytes(jpeg(1))
                await until(lambda: str(folder / "a.jpg") in w.rows())
                await asyncio.sleep(1.5)
                assert [kind for kind, _ in w.passes] == ["first", "hinted"]

        asyncio.run(scenario())
    finally:
        catalog.close()
