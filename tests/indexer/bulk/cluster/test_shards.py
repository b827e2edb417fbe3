"""The Parquet shards of a large `cnclip index --ray` run (indexer/bulk/cluster/shards.py): what a shard
holds comes back exactly (every fact the catalog stores, the vectors bit for bit, no bytes), a shard is
marked done by a manifest once committed, and a later run discards what a killed one left."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from indexer.bulk.cluster.shards import ShardLog, discard_left, read_shard
from indexer.bulk.reading import PreparedFile
from indexer.bulk.sources import SourceEntry


def prepared(index: int, folder: Path) -> PreparedFile:
    entry = SourceEntry(
        folder / f"{index}.jpg", caption="a cat" if index % 2 else None, tags=("x", f"t{index}"), root=folder
    )
    entry.extra["n"] = index
    return PreparedFile(
        entry=entry,
        data=b"bytes stay out of a shard",
        sha256=f"{index:064x}",
        mime="image/jpeg",
        width=640 + index,
        height=480,
        size=12_345 + index,
        mtime=1_700_000_000.123456 + index,
        replaces=None if index % 3 else 40 + index,
        taken=(datetime(2023, 1, 2, 3, 4, 5, 678901, tzinfo=UTC), "exif"),
        phash=-(2**63) + index,  # the signed 64-bit range, both ends
    )


def test_a_shard_gives_back_exactly_what_was_written(tmp_path: Path) -> None:
    files = [prepared(i, tmp_path / "photos") for i in range(5)]
    vectors = np.random.default_rng(0).standard_normal((5, 512)).astype(np.float32)
    log = ShardLog(tmp_path / "shards", "photos")
    path = log.write(list(zip(files, vectors, strict=True)))

    images, replaces, loaded = read_shard(path)
    assert loaded.dtype == np.float32 and np.array_equal(loaded, vectors)  # bit for bit
    assert replaces == [f.replaces for f in files]
    for image, file in zip(images, files, strict=True):
        assert image == file.new_image().__class__(**{**vars(file.new_image()), "data": b"", "size": file.size})


def test_a_committed_shard_keeps_its_manifest_and_a_later_run_discards_what_a_killed_one_left(tmp_path: Path) -> None:
    root = tmp_path / "shards"
    files = [(prepared(i, tmp_path), np.ones(4, dtype=np.float32)) for i in range(3)]
    killed = ShardLog(root, "photos")
    done = killed.write(files)
    killed.mark_done(done, rows=3)
    unfinished = killed.write(files)  # written, never committed: the driver died here
    assert not done.exists() and json.loads(done.with_suffix(".done.json").read_text())["rows"] == 3
    other = ShardLog(root, "photos.2024")  # another collection's run is left alone
    other.write(files)
    beside = root / f"Photos.20260101T000000Z.{os.getppid()}"  # a run of this collection whose driver lives
    beside.mkdir()

    assert discard_left(root, "photos") == 1 and not killed.folder.exists() and not unfinished.exists()
    assert other.folder.exists() and beside.exists()
    assert discard_left(root, "photos") == 0  # nothing left: the rerun starts its own folder
    rerun = ShardLog(root, "photos")
    assert rerun.folder.exists()
    rerun.close()
    assert not rerun.folder.exists()
