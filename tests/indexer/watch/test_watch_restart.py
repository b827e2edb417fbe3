"""A served watcher that dies is seen and brought back (indexer/watch/serve.py `keep_watching`,
indexer/watch/health.py): `/readyz` answers 503 `watcher_down` naming it and `/metrics` shows it
down while it waits, it is restarted with a doubling backoff, and then it indexes again."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from api.config import Settings
from indexer.watch.health import WatchHealth
from indexer.watch.serve import keep_watching
from indexer.watch.watcher import FolderWatcher
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import api_client
from tests.support.indexer_helpers import jpeg


def until(condition: Callable[[], bool], timeout: float) -> None:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(0.05)


def gauge(text: str, name: str, collection: str) -> float | None:
    match = re.search(rf'^{name}\{{collection="{collection}",folder="[^"]*"\}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else None


def test_a_watcher_that_dies_is_down_on_readyz_and_metrics_then_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "incoming"
    folder.mkdir()
    (folder / "first.jpg").write_bytes(jpeg(1))
    failures = {"left": 2}
    real_run = FolderWatcher.run

    async def dies_twice(self: FolderWatcher, stop: asyncio.Event, *args: Any) -> Any:
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("a bug nobody expected")
        return await real_run(self, stop, *args)

    monkeypatch.setattr(FolderWatcher, "run", dies_twice)
    settings = Settings(
        _env_file=None, data_dir=tmp_path / "data", provider="cpu", watch={str(folder): "photos"}, watch_quiet_s=0.3
    )
    with api_client(settings, encoder=FakeEncoder()) as client:
        until(lambda: client.get("/readyz").status_code == 503, 5)
        assert client.get("/readyz").json()["error"]["code"] == "watcher_down"  # the log line says why
        down = client.get("/metrics").text
        assert gauge(down, "cnclip_watcher_up", "photos") == 0.0
        assert f'cnclip_watcher_up{{collection="photos",folder="{folder}"}} 0.0' in down  # which one
        started = time.monotonic()
        until(lambda: client.get("/readyz").status_code == 200, 10)
        assert time.monotonic() - started >= 1.5  # 1 s, then 2 s: the backoff doubles while it keeps failing
        metrics = client.get("/metrics").text
        assert gauge(metrics, "cnclip_watcher_up", "photos") == 1.0
        assert gauge(metrics, "cnclip_watcher_restarts_total", "photos") == 2.0
        assert gauge(metrics, "cnclip_watcher_folder_here", "photos") == 1.0

        def found() -> set[str]:
            response = client.post("/v1/search/text", json={"query": "照片", "collection": "photos", "k": 50})
            return {hit["filename"] for hit in response.json()["results"]} if response.status_code == 200 else set()

        until(lambda: found() == {"first.jpg"}, 10)
        (folder / "new.jpg").write_bytes(jpeg(2))
        until(lambda: "new.jpg" in found(), 10)


def test_keep_watching_restarts_a_first_pass_that_failed(tmp_path: Path) -> None:
    """A watcher whose first pass fails (here: the folder is a file's name) ends; it is made again."""
    health = WatchHealth()
    status = health.add("photos", str(tmp_path))
    made: list[int] = []

    class Fails:
        label = "x → photos"
        health = None

        async def run(self, stop: asyncio.Event) -> None:
            from retrieval.errors import InvalidInput

            raise InvalidInput("photos is a text collection")

    def make() -> Any:
        made.append(1)
        return Fails()

    async def scenario() -> None:
        task = asyncio.create_task(keep_watching(make, status, first_backoff_s=0.05))
        await asyncio.sleep(0.5)
        problem = await health.problem()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert problem is not None and "text collection" in problem.message

    asyncio.run(scenario())
    assert 3 <= len(made) <= 5  # 0.05, 0.1, 0.2 s… between tries
    assert not status.up and status.restarts == len(made) - 1
