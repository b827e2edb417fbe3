"""A Milvus Lite file takes one process, and `cnclip serve` holds it: the commands beside the server
still do what SQL alone can. `cnclip index` writes SQL only and exits 0 (the server catches its
engine up from SQL within seconds); `cnclip stats` answers from SQL, its vector counts null with
the reason. Lite only: a Milvus server (or FAISS) is shared by every process."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli_server import found_ids, running_server, seconds_until
from tests.support.engines import EngineUnderTest
from tests.support.indexer_helpers import cli_env, jpeg, start_cli, write_images

LITE = EngineUnderTest("milvus-lite")


def run(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    process = start_cli(args, env)
    output, _ = process.communicate(timeout=120)
    return process.returncode, output


def test_index_and_stats_beside_a_server_holding_the_lite_file(
    tmp_path: Path, database_url: str, toy_model_dir: Path
) -> None:
    env = cli_env(tmp_path / "data", database_url, toy_model_dir, **LITE.env())
    first = tmp_path / "first"
    write_images(first, 4)
    status, output = run(["index", str(first), "--collection", "photos"], env)
    assert status == 0, output
    more = tmp_path / "more"
    more.mkdir()
    for i in range(5):  # other bytes than the first folder's
        (more / f"{i:04d}.jpg").write_bytes(jpeg(500 + i, (16, 16)))

    with running_server(env) as base:
        assert len(found_ids(base)) == 4  # the server has opened the Lite file: it holds it now

        status, output = run(["index", str(more), "--collection", "photos", "--dry-run"], env)
        assert status == 0 and "5 images to embed" in output, output
        status, output = run(["index", str(more), "--collection", "photos"], env)
        assert status == 0, output
        assert "indexed 5 new" in output and "Traceback" not in output
        seconds_until(base, lambda ids: len(ids) == 9, "5 items indexed beside the server")

        status, output = run(["stats", "--json"], env)
        assert status == 0, output
        (row,) = json.loads(output.strip().splitlines()[-1])["collections"]
        assert (row["name"], row["items"], row["vectors"]) == ("photos", 9, None)
        assert "in use by process" in row["vectors_unavailable"]

        status, output = run(["stats"], env)
        assert status == 0, output
        assert output.splitlines()[1].split()[:4] == ["photos", "images", "9", "-"]
        assert "vectors not counted: the Milvus Lite file" in output

    status, output = run(["stats", "--json"], env)  # the server is gone: the engine counts again
    assert status == 0, output
    (row,) = json.loads(output.strip().splitlines()[-1])["collections"]
    assert (row["items"], row["vectors"]) == (9, 9) and "vectors_unavailable" not in row
