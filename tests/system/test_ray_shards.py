"""`cnclip index --ray ADDRESS` above `--shard-threshold`, on a real two-node Ray cluster started on this
machine (tests/support/ray_cluster.py): the results are committed as Parquet shards of `--shard-rows`
rows, each loaded in one transaction (PostgreSQL COPY) — every file once, vectors equal to a local
run's, bad files counted, a second run indexes nothing, and a driver killed between shards loses at
most the shard it was committing; the rerun discards what it left and ends exact. On SQLite with
FAISS and on PostgreSQL with the real Milvus server (indexer/bulk/cluster/shards.py).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError
from typer.testing import CliRunner, Result

from cli.main import build_cli
from tests.support.indexer_helpers import cli_env, start_cli, write_images
from tests.support.ray_cluster import smallest_cosine, vectors_by_path

IMAGES = 120
SHARD_ROWS = 20  # 6 shards, each a multiple of the batch
SHARDS = ["--shard-threshold", "10", "--shard-rows", str(SHARD_ROWS)]  # 122 files to read: above 10


@pytest.fixture
def photos(tmp_path: Path) -> tuple[Path, list[Path]]:
    """`IMAGES` distinct JPEGs, one broken JPEG and one text file."""
    folder = tmp_path / "photos"
    images = write_images(folder, IMAGES)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 cut short")
    (folder / "notes.txt").write_text("not an image")
    return folder, images


def index_json(folder: Path, collection: str, env: dict[str, str], *extra: str) -> tuple[int, dict[str, Any]]:
    result: Result = CliRunner().invoke(
        build_cli(), ["index", str(folder), "-c", collection, "--batch-size", "4", "--json", *extra], env=env
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, result.output
    return result.exit_code, dict(json.loads(lines[0]))


def engine_counts(env: dict[str, str], collection: str) -> tuple[int, int]:
    """(items, vectors) of a collection as `cnclip stats` sees them: SQL and the vector engine."""
    result = CliRunner().invoke(build_cli(), ["stats", "--json"], env=env)
    assert result.exit_code == 0, result.output
    (row,) = [c for c in json.loads(result.stdout.splitlines()[-1])["collections"] if c["name"] == collection]
    return row["items"], row["vectors"]


def shard_folders(env: dict[str, str]) -> list[Path]:
    return sorted((Path(env["CNCLIP_DATA_DIR"]) / "shards").glob("photos.*"))


def test_a_run_above_the_threshold_commits_every_file_once_through_shards(
    cluster: Any, ray_catalog: tuple[str, dict[str, str]], photos: tuple[Path, list[Path]]
) -> None:
    url, env = ray_catalog
    folder, images = photos
    status, first = index_json(folder, "photos", env, "--ray", cluster.address, *SHARDS)
    assert status == 3 and (first["indexed"], first["failed"], first["not_images"]) == (IMAGES, 1, 1), first
    assert first["shards"] == IMAGES // SHARD_ROWS and first["shards_discarded"] == 0, first
    assert first["commit_rows_per_s"] > 0 and first["nodes"] == 2, first
    assert shard_folders(env) == []  # a run that ended leaves no shards

    status, local = index_json(folder, "local", env)
    assert status == 3 and local["indexed"] == IMAGES, local
    sharded = vectors_by_path(url, "photos")
    assert set(sharded) == {str(path) for path in images}  # every file, once (vectors_by_path checks)
    assert smallest_cosine(sharded, vectors_by_path(url, "local")) >= 0.9999
    assert engine_counts(env, "photos") == (IMAGES, IMAGES)

    status, again = index_json(folder, "photos", env, "--ray", cluster.address, *SHARDS)
    assert status == 3 and (again["indexed"], again["unchanged"], again["shards"]) == (0, IMAGES, 0), again
    assert engine_counts(env, "photos") == (IMAGES, IMAGES)


def test_below_the_threshold_a_run_commits_batches(
    cluster: Any, ray_catalog: tuple[str, dict[str, str]], photos: tuple[Path, list[Path]]
) -> None:
    folder, _ = photos
    status, run = index_json(folder, "photos", ray_catalog[1], "--ray", cluster.address, "--shard-threshold", "1000")
    assert status == 3 and (run["indexed"], run["shards"]) == (IMAGES, 0), run


def test_a_driver_killed_between_shards_reruns_to_an_exact_collection(
    cluster: Any, ray_catalog: tuple[str, dict[str, str]], photos: tuple[Path, list[Path]]
) -> None:
    url, env = ray_catalog
    folder, images = photos
    status, local = index_json(folder, "local", env)  # the reference; it also creates the catalog
    assert status == 3 and local["indexed"] == IMAGES, local
    args = ["index", str(folder), "-c", "photos", "--batch-size", "4", "--json", "--ray", cluster.address, *SHARDS]
    process = start_cli(args, env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(DBAPIError):  # the run's collection is not there yet
                if vectors_by_path(url, "photos"):
                    break
            time.sleep(0.02)
    finally:
        process.kill()  # SIGKILL between (or during) shards: no clean-up of its own
        output = process.communicate()[0]
    committed = len(vectors_by_path(url, "photos"))
    assert 0 < committed < IMAGES, output
    assert committed % SHARD_ROWS == 0, committed  # whole shards only: each is one transaction
    (left,) = shard_folders(env)
    marked = sum(json.loads(done.read_text())["rows"] for done in left.glob("*.done.json"))
    assert committed - SHARD_ROWS <= marked <= committed  # the manifest follows its commit (killed between: one late)
    unfinished = len(list(left.glob("*.parquet")))  # written, not marked done: at most the one being committed
    assert unfinished <= 1, list(left.iterdir())

    status, rerun = index_json(folder, "photos", env, "--ray", cluster.address, *SHARDS)
    assert status == 3 and (rerun["unchanged"], rerun["indexed"]) == (committed, IMAGES - committed), rerun
    assert rerun["shards"] == (IMAGES - committed) // SHARD_ROWS, rerun
    assert rerun["shards_discarded"] == unfinished, rerun
    assert shard_folders(env) == []  # the killed run's folder was discarded, the rerun's removed at its end
    sharded = vectors_by_path(url, "photos")
    assert set(sharded) == {str(path) for path in images}  # every file exactly once
    assert smallest_cosine(sharded, vectors_by_path(url, "local")) >= 0.9999
    assert engine_counts(env, "photos") == (IMAGES, IMAGES)


def test_the_shard_flags_go_with_ray_only(tmp_path: Path, toy_model_dir: Path) -> None:
    folder = tmp_path / "photos"
    write_images(folder, 2)
    env = cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'catalog.db'}", toy_model_dir)
    result = CliRunner().invoke(build_cli(), ["index", str(folder), "-c", "photos", "--shard-threshold", "5"], env=env)
    assert result.exit_code == 1 and "--shard-threshold and --shard-rows go with --ray" in result.output
    assert not (tmp_path / "catalog.db").exists()  # refused before anything opened
