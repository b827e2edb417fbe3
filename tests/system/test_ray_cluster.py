"""`cnclip index --ray ADDRESS` on a real two-node Ray cluster started on this machine
(tests/support/ray_cluster.py): every file is committed once, its vector equals a local run's, both
nodes embed, a second run indexes nothing, and a node removed or the driver killed mid-run leaves an
exact collection after the rerun. On SQLite with FAISS and on PostgreSQL with the real Milvus server.
And Ray stays an extra: `cnclip serve` and a plain `cnclip index` never import it; without it `--ray`
names the extra.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError
from typer.testing import CliRunner, Result

from cli.main import build_cli
from indexer.bulk.cluster.watchdog import STALL_S
from tests.support.indexer_helpers import cli_env, start_cli, write_images
from tests.support.ray_cluster import smallest_cosine, vectors_by_path

IMAGES = 240  # "a few hundred": 30 batches of 8, enough for both nodes' actors to take some
BATCH = "8"


@pytest.fixture
def photos(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A folder of `IMAGES` distinct JPEGs, one broken JPEG and one text file."""
    folder = tmp_path / "photos"
    images = write_images(folder, IMAGES)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 cut short")
    (folder / "notes.txt").write_text("not an image")
    return folder, images


def invoke(args: list[str], env: dict[str, str]) -> Result:
    return CliRunner().invoke(build_cli(), args, env=env)


def summary_of(result: Result) -> dict[str, Any]:
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, result.output  # --json: one summary line on stdout
    return dict(json.loads(lines[0]))


def index_json(folder: Path, collection: str, env: dict[str, str], address: str | None) -> tuple[int, dict[str, Any]]:
    ray = ["--ray", address] if address else []
    result = invoke(["index", str(folder), "-c", collection, "--batch-size", BATCH, "--json", *ray], env)
    return result.exit_code, summary_of(result)


def engine_counts(env: dict[str, str], collection: str) -> tuple[int, int]:
    """(items, vectors) of a collection as `cnclip stats` sees them: SQL and the vector engine."""
    result = invoke(["stats", "--json"], env)
    assert result.exit_code == 0, result.output
    (row,) = [c for c in json.loads(result.stdout.splitlines()[-1])["collections"] if c["name"] == collection]
    return row["items"], row["vectors"]


def wait_for_commits(url: str, collection: str, process: subprocess.Popen[str], timeout: float = 120.0) -> bool:
    """Poll until the run committed a first batch into `collection` (True) or ended first (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(DBAPIError):  # the run's collection is not there yet
            if vectors_by_path(url, collection):
                return True
        if process.poll() is not None:
            return False
        time.sleep(0.05)
    raise TimeoutError(f"nothing committed into {collection} after {timeout} s")


def test_a_two_node_run_commits_every_file_once_with_a_local_runs_vectors(
    cluster: Any, ray_catalog: tuple[str, dict[str, str]], photos: tuple[Path, list[Path]]
) -> None:
    url, env = ray_catalog
    folder, images = photos

    status, first = index_json(folder, "photos", env, cluster.address)
    assert status == 3  # the broken file: exit status and counts as in a local run
    assert (first["indexed"], first["failed"], first["not_images"]) == (IMAGES, 1, 1), first
    assert first["nodes"] == 2 and len(first["per_node"]) == 2, first  # both nodes embedded
    assert sum(node["images"] for node in first["per_node"].values()) == IMAGES
    assert all(node["images"] > 0 and node["images_per_s"] > 0 for node in first["per_node"].values())
    assert [json.loads(line)["path"] for line in Path(first["report"]).read_text().splitlines()] == [
        str(folder / "broken.jpg")
    ]

    status, local = index_json(folder, "local", env, None)
    assert status == 3 and (local["indexed"], local["failed"], local["nodes"]) == (IMAGES, 1, 1), local
    on_cluster, here = vectors_by_path(url, "photos"), vectors_by_path(url, "local")
    assert set(on_cluster) == {str(path) for path in images}  # every file, once (vectors_by_path checks)
    assert smallest_cosine(on_cluster, here) >= 0.9999
    assert engine_counts(env, "photos") == (IMAGES, IMAGES)  # the vector engine holds each once too

    status, again = index_json(folder, "photos", env, cluster.address)
    assert status == 3 and (again["indexed"], again["unchanged"], again["nodes"]) == (0, IMAGES, 0), again
    assert engine_counts(env, "photos") == (IMAGES, IMAGES)


def test_a_node_removed_mid_run_leaves_an_exact_collection_after_the_rerun(
    cluster: Any, ray_catalog: tuple[str, dict[str, str]], photos: tuple[Path, list[Path]]
) -> None:
    url, env = ray_catalog
    folder, images = photos
    status, local = index_json(folder, "local", env, None)  # the reference; it also creates the catalog
    assert status == 3 and local["indexed"] == IMAGES, local
    worker = next(node for node in cluster.list_all_nodes() if node is not cluster.head_node)
    args = ["index", str(folder), "-c", "photos", "--batch-size", BATCH, "--json", "--ray", cluster.address]
    process = start_cli(args, env)
    try:
        assert wait_for_commits(url, "photos", process), process.communicate()[0]
        cluster.remove_node(worker, allow_graceful=False)  # as a machine dies: no goodbye
        committed_at_kill = len(vectors_by_path(url, "photos"))
        # Ray redoes the lost work, or the run fails: at once, or when nothing came back for `STALL_S`.
        output = process.communicate(timeout=STALL_S + 120)[0]
    finally:
        if process.poll() is None:
            process.kill()
    cluster.wait_for_nodes()  # until Ray counts the removed node dead: the rerun sizes its actors by it
    assert committed_at_kill < IMAGES, "the run ended before the node was removed: nothing was tested"
    # Either Ray Data redid the lost work on the head (the run ends as usual), or the run failed in one line.
    assert process.returncode in (1, 3), output
    if process.returncode == 1:
        last = [line for line in output.splitlines() if line.strip()][-1]
        assert last.startswith("error: the Ray cluster lost the run") and "run the same command again" in last, output

    status, rerun = index_json(folder, "photos", env, cluster.address)
    assert status == 3 and rerun["failed"] == 1, rerun
    on_cluster = vectors_by_path(url, "photos")
    assert set(on_cluster) == {str(path) for path in images}  # every file exactly once
    assert smallest_cosine(on_cluster, vectors_by_path(url, "local")) >= 0.9999
    assert engine_counts(env, "photos") == (IMAGES, IMAGES)


def test_a_driver_killed_mid_run_loses_only_what_it_had_not_committed(
    cluster: Any, ray_catalog: tuple[str, dict[str, str]], photos: tuple[Path, list[Path]]
) -> None:
    url, env = ray_catalog
    folder, images = photos
    status, local = index_json(folder, "local", env, None)  # the reference; it also creates the catalog
    assert status == 3 and local["indexed"] == IMAGES, local
    args = ["index", str(folder), "-c", "photos", "--batch-size", BATCH, "--json", "--ray", cluster.address]
    process = start_cli(args, env)
    try:
        assert wait_for_commits(url, "photos", process), process.communicate()[0]
    finally:
        process.kill()  # SIGKILL: no clean-up of its own; Ray drops the job's tasks and actors
        process.communicate()
    committed = len(vectors_by_path(url, "photos"))
    assert 0 < committed < IMAGES, committed

    status, rerun = index_json(folder, "photos", env, cluster.address)
    assert status == 3 and rerun["unchanged"] == committed and rerun["indexed"] == IMAGES - committed, rerun
    on_cluster = vectors_by_path(url, "photos")
    assert set(on_cluster) == {str(path) for path in images}  # every file exactly once
    assert smallest_cosine(on_cluster, vectors_by_path(url, "local")) >= 0.9999
    assert engine_counts(env, "photos") == (IMAGES, IMAGES)


def test_ray_is_never_imported_by_serve_or_a_plain_index(tmp_path: Path, toy_model_dir: Path) -> None:
    folder = tmp_path / "photos"
    write_images(folder, 3)
    env = cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'catalog.db'}", toy_model_dir)
    script = (
        "import sys\n"
        "import api.app, cli.main\n"
        "from typer.testing import CliRunner\n"
        f"result = CliRunner().invoke(cli.main.build_cli(), ['index', {str(folder)!r}, '-c', 'photos', '--json'])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(result.stdout.splitlines()[-1])\n"
        "print(sorted(name for name in sys.modules if name == 'ray' or name.startswith('ray.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary, modules = done.stdout.strip().splitlines()[-2:]
    assert json.loads(summary)["indexed"] == 3 and modules == "[]"


def test_without_ray_the_flag_names_the_extra_in_one_line(tmp_path: Path, toy_model_dir: Path) -> None:
    folder = tmp_path / "photos"
    write_images(folder, 2)
    env = cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'catalog.db'}", toy_model_dir)
    script = (
        "import sys\n"
        "sys.modules['ray'] = None  # as if the extra were not installed\n"
        "from cli.main import main\n"
        f"sys.argv = ['cnclip', 'index', {str(folder)!r}, '-c', 'photos', '--ray', 'auto']\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "cnclip-search[cluster]" in line]
    assert len(lines) == 1 and "pip install 'cnclip-search[cluster]'" in lines[0], done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_ray_data_imports_beside_numpy_1() -> None:
    """The extra's pins hold: Ray Data needs pyarrow, and only pyarrow 20 keeps numpy 1 (onnxruntime-cann's);
    `pip check` does not see a pyarrow built for numpy 2, an import does."""
    import numpy
    import pyarrow
    import ray.data

    assert numpy.__version__.startswith("1.") and pyarrow.__version__.startswith("20.")
    assert callable(ray.data.from_items) and ray.__version__.startswith("2.60.")
