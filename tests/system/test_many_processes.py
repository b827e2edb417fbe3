"""Many processes, one truth: a running `cnclip serve` sees what `cnclip index` (another process)
adds and deletes within 2 s, with no restart, on every vector engine (FAISS, Milvus Lite, the real
Milvus server) and both databases; two
indexers writing one collection at once lose nothing and duplicate nothing; an item a user deleted
through the API is not brought back by the next index run."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import numpy as np

from tests.support.cli_server import found_ids, running_server, seconds_until
from tests.support.engines import EngineUnderTest
from tests.support.indexer_helpers import cli_env, jpeg, open_test_catalog, start_cli, write_images


def run_cli(args: list[str], env: dict[str, str]) -> str:
    process = start_cli(args, env)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    return output


def test_a_running_server_sees_another_process_add_and_delete(
    tmp_path: Path, database_url: str, toy_model_dir: Path, engine: EngineUnderTest
) -> None:
    env = cli_env(tmp_path / "data", database_url, toy_model_dir, **engine.env())
    folder = tmp_path / "photos"
    files = write_images(folder, 12)
    with running_server(env) as base:
        assert found_ids(base) == set()
        run_cli(["index", str(folder), "--collection", "photos"], env)
        seconds_until(base, lambda ids: len(ids) == 12, "12 items added by `cnclip index`")

        for path in files[:3]:
            path.unlink()
        run_cli(["index", str(folder), "--collection", "photos", "--prune"], env)
        seconds_until(base, lambda ids: len(ids) == 9, "3 items pruned by `cnclip index --prune`")

        victim = sorted(found_ids(base))[0]
        assert httpx.delete(f"{base}/v1/items/{victim}").status_code == 200
        assert victim not in found_ids(base)  # the server's own write: at once
        output = run_cli(["index", str(folder), "--collection", "photos"], env)
        assert "deleted earlier 1" in output
        time.sleep(0.3)
        assert len(found_ids(base)) == 8 and victim not in found_ids(base)  # not brought back
        stats = None
        if engine.name != "milvus-lite":  # Lite takes one process per file (the server holds it)
            # A text collection beside the photos (what broke a Milvus 2.3 server: no nullable mime).
            (tmp_path / "captions.txt").write_text("海边的日落\n一只猫\n", encoding="utf-8")
            assert "2 texts added" in run_cli(["index-texts", str(tmp_path / "captions.txt"), "-c", "captions"], env)
            assert len(found_ids(base)) == 8  # the photos still answer
            stats = run_cli(["stats", "--json"], env)
    if stats is not None:
        rows = {row["name"]: row for row in json.loads(stats.strip().splitlines()[-1])["collections"]}
        assert rows["photos"]["deleted"] == 1 and rows["photos"]["items"] == rows["photos"]["vectors"] == 8
        assert rows["captions"]["items"] == rows["captions"]["vectors"] == 2


def test_two_indexers_into_one_collection_lose_and_duplicate_nothing(
    tmp_path: Path, database_url: str, toy_model_dir: Path
) -> None:
    env = cli_env(tmp_path / "data", database_url, toy_model_dir, CNCLIP_INDEX_BATCH_SIZE="4")
    root = tmp_path / "photos"
    write_images(root / "a", 24)
    for i in range(24):  # other bytes under other names: 48 distinct images in all
        (root / "b" / f"{i:04d}.jpg").parent.mkdir(parents=True, exist_ok=True)
        (root / "b" / f"{i:04d}.jpg").write_bytes(jpeg(1000 + i, (16, 16)))
    # Overlapping runs: the whole tree, and one of its folders, at the same time.
    first = start_cli(["index", str(root), "--collection", "photos"], env)
    second = start_cli(["index", str(root / "a"), "--collection", "photos"], env)
    outputs = [p.communicate(timeout=180)[0] for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outputs
    added = [int(re.search(r"indexed (\d+) new", out).group(1)) for out in outputs]  # type: ignore[union-attr]
    assert sum(added) == 48, outputs  # each image counted as new by exactly one of them

    catalog = open_test_catalog(tmp_path / "data", database_url)
    try:
        states = catalog.file_states("photos")
        assert len(states) == 48 and len(set(s.sha256 for s in states.values())) == 48  # no loss, no duplicate
        assert np.array_equal(catalog.index_ids("photos"), catalog.sql_ids("photos"))
        assert catalog.get_collection("photos").items == 48
    finally:
        catalog.close()
