"""A folder watcher run in-process for the tests of indexer/watch/: started on a folder of "photos", waited
for until its first pass, stopped at the end, with what its passes reported."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from indexer.domain.index_summary import IndexSummary
from indexer.service.collections import CollectionService
from indexer.watch.watcher import FolderWatcher, WatchOptions
from retrieval.fake import FakeEncoder


class Watching:
    """A watcher of `folder` into "photos" (not started: `watching` runs it) and what its passes reported."""

    def __init__(self, service: CollectionService, folder: Path, options: WatchOptions, data_dir: Path) -> None:
        self.service = service
        self.passes: list[tuple[str, IndexSummary]] = []
        self.watcher = FolderWatcher(
            service,
            "photos",
            folder,
            options,
            data_dir,
            on_pass=lambda kind, summary: self.passes.append((kind, summary)),
            batch_size=4,
            read_threads=2,
        )
        self.stop = asyncio.Event()

    def rows(self) -> dict[str, Any]:
        """path -> file state of every row."""
        return self.service.file_states("photos")

    def embedded(self) -> int:
        """Images the (fake) encoder has embedded so far."""
        encoder = self.service.encoder
        assert isinstance(encoder, FakeEncoder)
        return sum(n for tower, n in encoder.calls if tower == "image")

    def full_passes(self) -> int:
        return sum(1 for kind, _ in self.passes if kind == "full")


@asynccontextmanager
async def watching(
    service: CollectionService, folder: Path, options: WatchOptions, data_dir: Path | None = None
) -> AsyncIterator[Watching]:
    """A watcher running until the block ends, entered once its first pass is done (its data dir beside
    `folder` unless given); a watcher that failed to start raises its error here."""
    w = Watching(service, folder, options, data_dir or folder.parent / "data")
    task = asyncio.create_task(w.watcher.run(w.stop))
    try:
        await until(lambda: bool(w.passes) or task.done(), 20)
        if task.done():
            task.result()
        yield w
    finally:
        w.stop.set()
        await asyncio.wait_for(task, 20)


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> float:
    """Seconds until `condition()` held; fails after `timeout`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - started
