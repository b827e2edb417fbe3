"""Saving a large index writes what changed, not the whole file (issue 34: adding 200 photos to a 1M
collection rewrote its 2 GB file per run): the base stays as it is, the changes are appended to its log,
loading replays them, and a torn, damaged or foreign log is never replayed past what is whole and its own."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from indexer.errors import StorageFull
from indexer.storage.vectors.base import SearchTuning
from indexer.storage.vectors.faiss import delta, saving
from indexer.storage.vectors.faiss.delta import delta_path
from indexer.storage.vectors.faiss.file import IndexFileError
from indexer.storage.vectors.faiss.index import VectorIndex

DIM = 256
BASE = 50_000


def _vectors(count: int, seed: int, dim: int = DIM) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, dim), dtype=np.float32)


def _written_bytes() -> int:
    """Bytes this process has handed to write() so far (Linux's per-process I/O accounting)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _held(index: VectorIndex) -> dict[int, np.ndarray]:
    ids = np.sort(index.ids())
    return dict(zip(ids.tolist(), index.index.reconstruct_batch(ids), strict=True))


def _small(tmp_path: Path, count: int = 100, dim: int = 8) -> tuple[VectorIndex, Path]:
    index = VectorIndex(dim, "Flat", "m")
    index.add(np.arange(count), _vectors(count, 0, dim))
    path = tmp_path / "c.faiss"
    index.save(path)
    return index, path


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> tuple[VectorIndex, Path]:
    path = tmp_path_factory.mktemp("large") / "c.faiss"
    index = VectorIndex(DIM, "Flat", "m")
    index.add(np.arange(BASE), _vectors(BASE, 0))
    index.save(path)
    return index, path


def test_adding_200_to_a_large_index_writes_about_200_vectors_and_leaves_its_file_alone(
    large: tuple[VectorIndex, Path],
) -> None:
    index, path = large
    before, digest = os.stat(path), _digest(path)
    added = _vectors(200, 1)
    index.add(np.arange(BASE, BASE + 200), added)

    written = _written_bytes()
    index.save(path)
    written = _written_bytes() - written

    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    assert _digest(path) == digest
    vectors_bytes = 200 * (8 + 4 * DIM)  # ids and float32 vectors
    assert vectors_bytes <= delta_path(path).stat().st_size <= vectors_bytes + 200
    assert written <= vectors_bytes + 200, written  # against the base's 51 MB
    loaded = VectorIndex.load(path, DIM, "Flat", "m")
    assert loaded.ntotal == BASE + 200
    held = _held(loaded)
    assert sorted(held) == list(range(BASE + 200))
    assert np.array_equal(np.stack([held[BASE + n] for n in range(200)]), added)


def test_removals_and_a_re_added_id_replay_in_order(tmp_path: Path) -> None:
    index, path = _small(tmp_path)
    base = os.stat(path).st_ino
    index.remove(np.array([3, 4, 5]))
    index.save(path)
    again = _vectors(1, 9, 8)
    index.add(np.array([4]), again)  # removed, then back with another vector
    index.add(np.array([100, 101]), _vectors(2, 10, 8))
    index.remove(np.array([100, 7]))
    index.save(path)
    assert os.stat(path).st_ino == base  # appended both times, never rewritten
    loaded = VectorIndex.load(path, 8, "Flat", "m")
    held = _held(loaded)
    assert sorted(held) == sorted(set(range(100)) - {3, 5, 7} | {4, 101})
    assert np.array_equal(held[4], again[0])
    expected = _held(index)
    assert sorted(expected) == sorted(held) and all(np.array_equal(held[i], expected[i]) for i in held)


def test_a_torn_or_damaged_last_record_stops_the_replay_and_the_next_save_rewrites(tmp_path: Path) -> None:
    for damage in ("torn", "flipped"):
        index, path = _small(tmp_path / damage)
        index.add(np.array([200]), _vectors(1, 1, 8))
        index.save(path)
        whole = delta_path(path).stat().st_size
        index.add(np.array([201, 202]), _vectors(2, 2, 8))
        index.save(path)
        log = bytearray(delta_path(path).read_bytes())
        if damage == "torn":  # a crash mid-append
            del log[-7:]
        else:  # a bit gone bad inside the last record's vectors
            log[whole + 20] ^= 0x40
        delta_path(path).write_bytes(bytes(log))

        loaded = VectorIndex.load(path, 8, "Flat", "m")
        assert sorted(loaded.ids()) == [*range(100), 200]  # the whole record before it is kept
        base = os.stat(path).st_ino
        loaded.add(np.array([300]), _vectors(1, 3, 8))
        loaded.save(path)  # never appended after a torn record: rewritten, the log dropped
        assert os.stat(path).st_ino != base and not delta_path(path).exists()
        assert sorted(VectorIndex.load(path, 8, "Flat", "m").ids()) == [*range(100), 200, 300]


def test_a_log_left_beside_another_base_is_ignored(tmp_path: Path) -> None:
    index, path = _small(tmp_path)
    index.add(np.array([500]), _vectors(1, 1, 8))
    index.save(path)
    old_log = delta_path(path).read_bytes()
    index.remove(np.array([500]))
    index.needs_full_save = True
    index.save(path)  # a new base: its log is gone
    assert not delta_path(path).exists()
    delta_path(path).write_bytes(old_log)  # as a crash between the rename and the unlink leaves it
    loaded = VectorIndex.load(path, 8, "Flat", "m")
    assert 500 not in loaded.ids() and loaded.ntotal == 100


def test_a_corrupt_base_is_refused_even_with_a_good_log(tmp_path: Path) -> None:
    index, path = _small(tmp_path)
    index.add(np.array([500]), _vectors(1, 1, 8))
    index.save(path)
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFileError, match="checksum"):
        VectorIndex.load(path, 8, "Flat", "m")


def test_the_log_is_compacted_into_the_base_past_a_quarter_of_it(tmp_path: Path) -> None:
    index = VectorIndex(8, "Flat", "m")
    index.add(np.arange(20_000), _vectors(20_000, 0, 8))
    path = tmp_path / "c.faiss"
    index.save(path)
    base = os.stat(path).st_ino
    for step in range(2):  # 4,000 of the 5,000 a log of a 20,000 base may carry
        index.add(np.arange(20_000 + 2000 * step, 22_000 + 2000 * step), _vectors(2000, step + 1, 8))
        index.save(path)
        assert os.stat(path).st_ino == base and delta_path(path).exists()
    index.add(np.arange(24_000, 26_000), _vectors(2000, 5, 8))
    index.save(path)
    assert os.stat(path).st_ino != base and not delta_path(path).exists()
    loaded = VectorIndex.load(path, 8, "Flat", "m")
    assert loaded.ntotal == 26_000 and loaded.files.on_disk is not None
    assert loaded.files.on_disk.base_vectors == 26_000  # the next allowance follows the new base


def test_a_swapped_in_index_is_saved_whole(tmp_path: Path) -> None:
    index, path = _small(tmp_path)
    base = os.stat(path).st_ino
    rebuilt = index.build(np.arange(100), lambda ids: _vectors(100, 0, 8)[ids])
    index.replace_with(rebuilt)
    assert index.needs_full_save
    index.save(path)
    assert os.stat(path).st_ino != base and not index.needs_full_save


def test_after_another_process_appended_a_save_rewrites_instead_of_appending(tmp_path: Path) -> None:
    _, path = _small(tmp_path)
    first = VectorIndex.load(path, 8, "Flat", "m")  # two processes sharing the data dir
    second = VectorIndex.load(path, 8, "Flat", "m")
    first.add(np.array([200]), _vectors(1, 1, 8))
    first.save(path)
    second.add(np.array([300]), _vectors(1, 2, 8))
    second.save(path)  # its memory lacks 200: appending 300 after 200 would not be its state
    assert not delta_path(path).exists()
    assert sorted(VectorIndex.load(path, 8, "Flat", "m").ids()) == [*range(100), 300]  # SQL adds 200 back


def test_a_failed_append_keeps_the_changes_and_leaves_whole_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index, path = _small(tmp_path)
    index.add(np.array([200]), _vectors(1, 1, 8))
    index.save(path)
    whole = delta_path(path).stat().st_size
    index.add(np.array([201]), _vectors(1, 2, 8))

    def full_disk(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(delta, "_write_all", full_disk)
        with pytest.raises(StorageFull):
            index.save(path)
    assert delta_path(path).stat().st_size == whole  # cut back: no torn record
    base = os.stat(path).st_ino
    index.save(path)  # retried later, as the store does
    assert os.stat(path).st_ino == base
    assert sorted(VectorIndex.load(path, 8, "Flat", "m").ids()) == [*range(100), 200, 201]


def test_pending_vectors_past_the_memory_cap_make_the_next_save_a_rewrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index, path = _small(tmp_path)
    monkeypatch.setattr(saving, "PENDING_MAX_BYTES", 50 * (8 + 4 * 8))
    index.add(np.arange(200, 240), _vectors(40, 1, 8))
    assert not index.needs_full_save and len(index.files.changes.changes) == 1
    index.add(np.arange(240, 260), _vectors(20, 2, 8))
    assert index.needs_full_save and index.files.changes.changes == []  # nothing held for a rewrite
    base = os.stat(path).st_ino
    index.save(path)
    assert os.stat(path).st_ino != base
    assert sorted(VectorIndex.load(path, 8, "Flat", "m").ids()) == [*range(100), *range(200, 260)]


@pytest.mark.parametrize("factory", ["IVF4,Flat", "HNSW8"])
def test_a_trained_index_replays_its_log_too(tmp_path: Path, factory: str) -> None:
    vectors = _vectors(500, 0, 8)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)  # so each vector is its own best match
    index = VectorIndex(8, factory, "m", SearchTuning(train_min=100)).build(np.arange(400), lambda ids: vectors[ids])
    assert index.active == factory
    path = tmp_path / "c.faiss"
    index.save(path)
    base = os.stat(path).st_ino
    index.add(np.arange(400, 500), vectors[400:])
    index.remove(np.array([7, 450]))  # HNSW cannot remove: tombstones, replayed as such
    index.save(path)
    assert os.stat(path).st_ino == base
    loaded = VectorIndex.load(path, 8, factory, "m", SearchTuning(train_min=100))
    assert loaded.active == factory and loaded.tombstones == index.tombstones
    assert sorted(loaded.ids()) == sorted(set(range(500)) - {7, 450})
    found, _ = loaded.search(vectors[420], 1, lambda ids: vectors[ids])
    assert found[0] == 420
