"""A migration across real processes: `cnclip serve` holding both models (CNCLIP_MODEL_DIRS) answers a
steady search load while `cnclip migrate` fills, swaps and the server moves to the new generation —
no search fails, on FAISS and on a Milvus Lite file the server holds; and `cnclip migrate` killed with
SIGKILL mid-fill resumes where it stopped."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.support.cli_server import running_server, searches_meanwhile
from tests.support.engines import EngineUnderTest
from tests.support.indexer_helpers import cli_env, start_cli, write_images


def run(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    process = start_cli(args, env)
    output, _ = process.communicate(timeout=180)
    return process.returncode, output


def status(env: dict[str, str]) -> dict[str, object]:
    code, output = run(["migrate", "-c", "photos", "--status", "--json"], env)
    assert code == 0, output
    return json.loads(output.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("engine_name", ["faiss", "milvus-lite"])
def test_a_server_answers_every_search_through_a_migration(
    tmp_path: Path, toy_model_dir: Path, next_model: Path, engine_name: str
) -> None:
    engine = EngineUnderTest(engine_name)
    env = cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'c.db'}", toy_model_dir, **engine.env())
    write_images(tmp_path / "photos", 12)
    code, output = run(["index", str(tmp_path / "photos"), "--collection", "photos"], env)
    assert code == 0, output
    server_env = {**env, "CNCLIP_MODEL_DIRS": json.dumps([str(next_model)]), "CNCLIP_SYNC_INTERVAL_S": "0.1"}
    with running_server(server_env) as base:
        with searches_meanwhile(base) as answers:
            code, output = run(["migrate", "-c", "photos", "--model", str(next_model), "--batch", "4"], env)
            assert code == 0, output
            deadline = time.monotonic() + 30
            while httpx.get(base + "/v1/collections/photos").json()["model"] != status(env)["active"]["model"]:  # type: ignore[index]
                assert time.monotonic() < deadline
                time.sleep(0.1)
            seen = len(answers)
            while len(answers) < seen + 10:  # searches after the swap, answered by the new model
                assert time.monotonic() < deadline + 30
                time.sleep(0.05)
        failed = [a for a in answers if a != (200, 5)]
        assert not failed and len(answers) > 20, failed[:5]
        listed = httpx.get(base + "/v1/collections/photos").json()
        assert (listed["dim"], listed["migration"]) == (16, None)


def test_a_killed_migration_resumes(tmp_path: Path, toy_model_dir: Path, next_model: Path) -> None:
    env = cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'c.db'}", toy_model_dir)
    write_images(tmp_path / "photos", 10)
    assert run(["index", str(tmp_path / "photos"), "--collection", "photos"], env)[0] == 0
    process = start_cli(["migrate", "-c", "photos", "--model", str(next_model), "--batch", "1", "--throttle", "1"], env)
    deadline = time.monotonic() + 60
    while (shadow := status(env)["shadow"]) is None or shadow["vectors"] < 2:  # type: ignore[index]
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    partial = status(env)
    assert partial["active"]["dim"] == 32 and 2 <= partial["shadow"]["vectors"] < 10  # type: ignore[index]
    code, output = run(["migrate", "-c", "photos", "--model", str(next_model), "--json"], env)
    assert code == 0, output
    report = json.loads(output.strip().splitlines()[-1])
    assert report["swapped"] and report["embedded"] == 10 - partial["shadow"]["vectors"]  # type: ignore[index]
