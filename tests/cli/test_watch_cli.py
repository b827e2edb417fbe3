"""`cnclip index --watch` as a process (the toy model): kill -9 and resume without loss or duplicates,
two watchers of one folder, Ctrl-C and SIGTERM, hostile options and settings (one line, exit status
of cli/errors.py), and a new photo searchable within 5 s: `cnclip serve` with CNCLIP_WATCH, and a
server beside an external `cnclip index --watch`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from typer.testing import CliRunner, Result

from api.config import Settings
from cli.main import build_cli
from indexer.storage.sql.db import DatabaseUnavailable, create_db_engine
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import api_client
from tests.support.indexer_helpers import cli_env, jpeg, wait_for_items, write_images


def python_cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """`python3 -m cli.main …`, as the README's contributors run it."""
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def rows(engine: Engine) -> list[tuple[str, str]]:
    """(path, sha256) of every item ([] while the catalog is not made yet)."""
    try:
        with engine.connect() as connection:
            return [(str(p), str(s)) for p, s in connection.exec_driver_sql("SELECT path, sha256 FROM items")]
    except (DBAPIError, DatabaseUnavailable):
        return []


def until(condition: Callable[[], bool], timeout: float, process: subprocess.Popen[str] | None = None) -> float:
    started = time.monotonic()
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the watcher ended: {process.communicate()[0]}")
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - started


def stop(process: subprocess.Popen[str], signum: int = signal.SIGINT) -> tuple[int, str]:
    process.send_signal(signum)
    output, _ = process.communicate(timeout=60)
    return process.returncode, output


@pytest.fixture
def env(tmp_path: Path, toy_model_dir: Path) -> dict[str, str]:
    return cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'data' / 'catalog.db'}", toy_model_dir)


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    # indexer.storage.sql.db's engine: it never makes the file (a zero-length catalog is refused by every command)
    return create_db_engine(f"sqlite:///{tmp_path / 'data' / 'catalog.db'}")


def test_kill_9_then_resume_loses_nothing_and_duplicates_nothing(
    tmp_path: Path, env: dict[str, str], engine: Engine
) -> None:
    folder = tmp_path / "photos"
    files = write_images(folder, 60)
    args = ["index", str(folder), "--collection", "photos", "--watch", "--batch-size", "2"]
    first = python_cli(args, env)
    assert wait_for_items(engine, first, at_least=4), first.communicate()[0]
    first.kill()  # SIGKILL: no handler runs
    first.wait()
    assert len(rows(engine)) < 60  # killed in the middle of the first pass
    files[0].unlink()  # changed while nobody watched
    (folder / "late.jpg").write_bytes(jpeg(1000))

    again = python_cli(args, env)
    expected = {str(p) for p in files[1:]} | {str(folder / "late.jpg")}
    until(lambda: {p for p, _ in rows(engine)} == expected, 60, again)
    (folder / "live.jpg").write_bytes(jpeg(1001))  # and it watches on
    took = until(lambda: str(folder / "live.jpg") in {p for p, _ in rows(engine)}, 10, again)
    status, output = stop(again)
    assert status == 0, output
    assert "watching" in output and took < 5
    found = rows(engine)
    assert len(found) == len({s for _, s in found}) == 61  # one row per file, no duplicates


def test_two_watchers_of_one_folder(tmp_path: Path, env: dict[str, str], engine: Engine) -> None:
    folder = tmp_path / "photos"
    write_images(folder, 3)
    args = ["index", str(folder), "--collection", "photos", "--watch"]
    first = python_cli(args, env)
    until(lambda: len(rows(engine)) == 3, 60, first)
    second = python_cli(args, env)
    time.sleep(3)  # it starts, finds the lock taken and stands by
    (folder / "a.jpg").write_bytes(jpeg(500))
    until(lambda: len(rows(engine)) == 4, 10, first)
    status, output = stop(first, signal.SIGTERM)
    assert status == 0, output
    (folder / "b.jpg").write_bytes(jpeg(501))  # the second one takes over
    until(lambda: len(rows(engine)) == 5, 20, second)
    # The takeover's full pass re-checks a file written within the quiet period before it ends (issue
    # 29): stopped before that, it would say "interrupted" (130) — let the pass finish first.
    time.sleep(3)
    status, output = stop(second)
    assert status == 0, output
    assert output.count("standing by") == 1 and f"pid {first.pid}" in output and "taking over" in output
    found = rows(engine)
    assert len({p for p, _ in found}) == len({s for _, s in found}) == 5


def invoke(args: list[str], env: dict[str, str]) -> Result:
    return CliRunner().invoke(build_cli(), args, env=env)


@pytest.mark.parametrize(
    ("extra", "status", "message"),
    [
        (["--watch", "--dry-run"], 1, "--watch and --dry-run do not go together"),
        (["--poll"], 1, "--rescan-interval and --poll go with --watch"),
        (["--watch", "--rescan-interval", "-5"], 2, "--rescan-interval"),
        (["--watch", "--rescan-interval", "0"], 2, "--rescan-interval"),
    ],
)
def test_hostile_watch_options(
    tmp_path: Path, env: dict[str, str], extra: list[str], status: int, message: str
) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    result = invoke(["index", str(folder), "--collection", "photos", *extra], env)
    assert result.exit_code == status, result.output
    assert message in result.output


def test_a_manifest_or_a_missing_folder_cannot_be_watched(tmp_path: Path, env: dict[str, str]) -> None:
    manifest = tmp_path / "list.jsonl"
    manifest.write_text('{"path": "a.jpg"}\n')
    result = invoke(["index", str(manifest), "--collection", "photos", "--watch"], env)
    assert result.exit_code == 1 and "is not a folder: --watch watches a folder" in result.output
    result = invoke(["index", str(tmp_path / "nowhere"), "--collection", "photos", "--watch"], env)
    assert result.exit_code == 1 and "does not exist" in result.output


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("CNCLIP_WATCH", "/srv/photos:photos", "error: CNCLIP_WATCH: not JSON"),
        ("CNCLIP_WATCH", '{"relative/photos": "photos"}', "give an absolute folder"),
        (
            "CNCLIP_WATCH",
            '{"/no/such/folder/anywhere": "photos"}',
            "CNCLIP_WATCH: /no/such/folder/anywhere is not a folder",
        ),
        ("CNCLIP_WATCH_RESCAN_INTERVAL_S", "-1", "error: CNCLIP_WATCH_RESCAN_INTERVAL_S: Input should be greater"),
        ("CNCLIP_WATCH_QUIET_S", "0", "error: CNCLIP_WATCH_QUIET_S: Input should be greater than 0"),
    ],
)
def test_hostile_watch_settings_stop_serve_in_one_line(
    env: dict[str, str], variable: str, value: str, message: str
) -> None:
    result = invoke(["serve", "--port", "0"], {**env, variable: value})
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_bad_watch_tuning_stops_index_in_one_line(tmp_path: Path, env: dict[str, str]) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    result = invoke(["index", str(folder), "-c", "photos", "--watch"], {**env, "CNCLIP_WATCH_POLL_INTERVAL_S": "-3"})
    assert result.exit_code == 2 and result.output.strip() == (
        "error: CNCLIP_WATCH_POLL_INTERVAL_S: Input should be greater than or equal to 0.1"
    )


@pytest.mark.parametrize("vector_store", ["faiss", "milvus"])  # FAISS files, Milvus Lite
def test_a_served_watcher_makes_a_new_photo_searchable_within_5_s(
    tmp_path: Path, toy_model_dir: Path, vector_store: str
) -> None:
    folder = tmp_path / "incoming"
    folder.mkdir()
    (folder / "first.jpg").write_bytes(jpeg(1))
    settings = Settings(
        _env_file=None,
        model_dir=toy_model_dir,
        data_dir=tmp_path / "data",
        provider="cpu",
        watch={str(folder): "photos"},
        watch_quiet_s=0.5,
        vector_store=vector_store,
    )

    def found(client: object) -> set[str]:
        response = client.post("/v1/search/text", json={"query": "照片", "collection": "photos", "k": 50})  # type: ignore[attr-defined]
        return {hit["filename"] for hit in response.json()["results"]} if response.status_code == 200 else set()

    def ids(client: object) -> dict[str, int]:
        response = client.post("/v1/search/text", json={"query": "照片", "collection": "photos", "k": 50})  # type: ignore[attr-defined]
        return {hit["filename"]: hit["id"] for hit in response.json()["results"]}

    with api_client(settings, encoder=FakeEncoder()) as client:
        until(lambda: found(client) == {"first.jpg"}, 10)
        data = jpeg(2)
        with open(folder / "new.jpg", "wb") as f:
            f.write(data)
        took = until(lambda: "new.jpg" in found(client), 5)
        assert took < 5
        before = ids(client)
        os.rename(folder / "new.jpg", folder / "renamed.jpg")
        until(lambda: found(client) == {"first.jpg", "renamed.jpg"}, 5)
        assert ids(client)["renamed.jpg"] == before["new.jpg"]  # the same item, under its new name
        (folder / "first.jpg").unlink()
        until(lambda: found(client) == {"renamed.jpg"}, 5)


def test_an_external_watcher_beside_a_server(
    tmp_path: Path, toy_model_dir: Path, env: dict[str, str], engine: Engine
) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app

    folder = tmp_path / "incoming"
    folder.mkdir()
    (folder / "first.jpg").write_bytes(jpeg(1))
    watcher = python_cli(["index", str(folder), "-c", "photos", "--watch"], {**env, "CNCLIP_WATCH_QUIET_S": "0.5"})
    until(lambda: len(rows(engine)) == 1, 60, watcher)
    settings = Settings(_env_file=None, model_dir=toy_model_dir, data_dir=tmp_path / "data", provider="cpu")

    def found(client: TestClient) -> set[str]:
        response = client.post("/v1/search/text", json={"query": "照片", "collection": "photos", "k": 50})
        return {hit["filename"] for hit in response.json()["results"]}

    with TestClient(create_app(settings)) as client:  # the toy model, as the watcher's
        assert found(client) == {"first.jpg"}
        (folder / "new.jpg").write_bytes(jpeg(2))
        took = until(lambda: "new.jpg" in found(client), 5, watcher)  # the server catches up from SQL
    status, output = stop(watcher)
    assert status == 0 and took < 5, output
