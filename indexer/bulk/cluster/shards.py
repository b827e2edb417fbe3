"""Parquet shards of a large `cnclip index --ray` run: above `shard_threshold` files to read, the driver
does not commit every `batch_size` images; it writes what the cluster embedded as Parquet shards of
`shard_rows` rows under the data dir's `shards/<run-id>/`, and the committer loads each shard, read
back from its file, in one transaction through the collection service's bulk load (`load_images`:
PostgreSQL COPY, SQLite one executemany; indexer/storage/sql/bulk_load.py). After the commit it
writes the shard's manifest (`shard-NNNNN.done.json`, atomically) and removes its Parquet file; a run
that ends removes its folder. The vector engine is filled from SQL afterwards, as after any run, by
the catalog's sync: 20,000 vectors per call (indexer/storage/sync.py).

A killed driver loses at most the shards it had not committed. The next `--ray` run of the collection
discards every folder an earlier run left (`discard_left`; not one whose driver still runs on this machine,
a second indexer of the collection): a shard without a manifest was never committed,
and its files are planned again from the catalog like any others, so nothing is committed twice.
Committing such a shard instead would trust files read before the kill, which may have changed or
been deleted since (a user's deletion must win), and a shard with a manifest is in the catalog already.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from indexer.bulk.reading import PreparedFile
from indexer.domain.names import collection_key
from indexer.domain.records import NewImage

log = logging.getLogger(__name__)

SHARD_THRESHOLD = 50_000  # files to read above which a run commits through shards (`--shard-threshold`)
SHARD_ROWS = 10_000  # rows per shard (`--shard-rows`): one transaction, one COPY of each table

Shard = tuple[list[NewImage], list[int | None], np.ndarray]  # the images, the rows they replace, their vectors


def _schema(dim: int) -> pa.Schema:
    text, number = pa.string(), pa.int64()
    return pa.schema(
        [
            ("path", text), ("root", text), ("caption", text), ("tags", pa.list_(text)), ("extra", text),
            ("sha256", text), ("size", number), ("mime", text), ("width", number), ("height", number),
            ("mtime", pa.float64()), ("taken_at", text), ("taken_source", text), ("phash", number),
            ("replaces", number), ("vector", pa.list_(pa.float32(), dim)),
        ]
    )  # fmt: skip


def discard_left(root: Path, collection: str) -> int:
    """Remove the shard folders earlier runs of `collection` left under `root`; returns how many shards
    (Parquet files: never committed) went with them."""
    dropped = 0
    for folder in sorted(root.glob("*.*.*")):
        name, _, pid = folder.name.rsplit(".", 2)
        if collection_key(name) != collection_key(collection) or (pid.isdigit() and _running(int(pid))):
            continue  # another collection's, or a run of this one going on beside (two indexers at once)
        dropped += len(list(folder.glob("*.parquet")))
        shutil.rmtree(folder, ignore_errors=True)
    if dropped:
        log.info(
            "%d uncommitted shards of an earlier run of %s discarded: their files are planned again",
            dropped,
            collection,
        )
    return dropped


def _running(pid: int) -> bool:
    """Whether the process `pid` lives (the run folders name their driver's pid; this one is not left)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ShardLog:
    """One run's shards under `root/<collection>.<UTC time>.<pid>/`: written, read back, marked done."""

    def __init__(self, root: Path, collection: str) -> None:
        self.folder = root / f"{collection}.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.{os.getpid()}"
        self.folder.mkdir(parents=True)
        self.written = 0

    def write(self, pending: list[tuple[PreparedFile, np.ndarray]]) -> Path:
        """`pending` (files and their vectors) as the next shard; its path once the file is complete."""
        vectors = np.stack([vector for _, vector in pending]).astype(np.float32)
        images = [prepared.new_image() for prepared, _ in pending]
        columns = {
            "path": [i.path for i in images],
            "root": [i.root for i in images],
            "caption": [i.caption for i in images],
            "tags": [i.tags for i in images],
            "extra": [json.dumps(i.extra) for i in images],
            "sha256": [i.sha256 for i in images],
            "size": [prepared.size for prepared, _ in pending],
            "mime": [i.mime for i in images],
            "width": [i.width for i in images],
            "height": [i.height for i in images],
            "mtime": [i.mtime for i in images],
            "taken_at": [i.taken_at.isoformat() if i.taken_at else None for i in images],  # aware UTC, exactly
            "taken_source": [i.taken_source for i in images],
            "phash": [i.phash for i in images],
            "replaces": [prepared.replaces for prepared, _ in pending],
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1]),
        }
        self.written += 1
        path = self.folder / f"shard-{self.written:05d}.parquet"
        partial = path.with_suffix(".partial")
        pq.write_table(pa.table(columns, schema=_schema(vectors.shape[1])), partial)
        os.replace(partial, path)
        return path

    def mark_done(self, path: Path, rows: int) -> None:
        """After the shard's commit: its manifest, written atomically; then its Parquet file goes."""
        manifest = path.with_suffix(".done.json")
        partial = manifest.with_suffix(".partial")
        with open(partial, "w") as out:
            json.dump({"shard": path.name, "rows": rows, "committed_at": time.time()}, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, manifest)
        path.unlink()

    def close(self) -> None:
        """The run ended (every shard committed, or it stopped): its folder goes."""
        shutil.rmtree(self.folder, ignore_errors=True)


def read_shard(path: Path) -> Shard:
    """The images (without their bytes: `size` says how many), the rows they replace and their vectors."""
    table = pq.read_table(path)
    rows = table.drop_columns(["vector"]).to_pylist()  # the vectors as one array, not Python floats
    vectors = table.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    images = [
        NewImage(
            data=b"",
            path=row["path"],
            root=row["root"],
            caption=row["caption"],
            tags=list(row["tags"]),
            extra=json.loads(row["extra"]),
            mtime=row["mtime"],
            mime=row["mime"],
            width=row["width"],
            height=row["height"],
            sha256=row["sha256"],
            taken_at=datetime.fromisoformat(row["taken_at"]) if row["taken_at"] else None,
            taken_source=row["taken_source"],
            phash=row["phash"],
            size=row["size"],
        )
        for row in rows
    ]
    return images, [row["replaces"] for row in rows], vectors.reshape(len(rows), -1).astype(np.float32)
