"""`cnclip serve` with `CNCLIP_WATCH`: one background task per watched folder, each keeping its
watcher (indexer/watch/watcher.py) running: a watcher that ends or fails is down (indexer/watch/health.py:
`/readyz`, `/metrics`) and is made again and restarted after a backoff that doubles while it keeps
failing. Cancelling the task (the server shutting down) stops the watcher the gentle way."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from indexer.bulk.pipeline import ImageIndexer
from indexer.config import StorageSettings
from indexer.watch.health import BACKOFF_FIRST_S, BACKOFF_MAX_S, STEADY_S, WatcherHealth, WatchHealth
from indexer.watch.settings import WatchedFolder
from indexer.watch.watcher import STOP_GRACE_S, FolderWatcher, WatchOptions
from retrieval.errors import CnclipError

log = logging.getLogger("indexer.watch.watcher")


def watch_served_folders(
    runtime: Any, settings: StorageSettings, folders: list[WatchedFolder], health: WatchHealth | None = None
) -> None:
    """Register one background task per watched folder with the server's runtime (indexer/runtime.py);
    each keeps its watcher running (restarted with backoff) and says how it is doing in `health`."""
    health = health if health is not None else WatchHealth()
    for watched in folders:
        status = health.add(watched.collection, str(watched.folder))

        def make(watched: WatchedFolder = watched) -> FolderWatcher:
            return FolderWatcher(
                runtime.service,
                watched.collection,
                watched.folder,
                WatchOptions.from_settings(settings),
                settings.data_dir,
                pipeline=ImageIndexer.from_settings(settings, runtime.service, watched.collection),
            )

        async def job(make: Callable[[], FolderWatcher] = make, status: WatcherHealth = status) -> None:
            await keep_watching(make, status)

        runtime.run_in_background(f"watch {watched.collection} {watched.folder}", job)


async def keep_watching(
    make: Callable[[], FolderWatcher], status: WatcherHealth, first_backoff_s: float = BACKOFF_FIRST_S
) -> None:
    """Run a watcher until cancelled. One that ends (its first pass failed: the line says why) or
    fails (anything else: logged with its traceback) is down (`status`: /readyz, /metrics) and is
    made again and restarted after a backoff that doubles while it keeps failing."""
    backoff: float | None = None
    while True:
        watcher = make()
        watcher.health = status
        started = time.monotonic()
        status.up, status.reason = True, None
        try:
            reason = await run_until_cancelled(watcher) or "it stopped"
        except Exception as exc:  # noqa: BLE001 - a watcher's bug must not end watching: logged, restarted
            log.exception("watch %s: the watcher failed", watcher.label)
            reason = f"{type(exc).__name__}: {exc}"
        ran = time.monotonic() - started
        backoff = first_backoff_s if backoff is None or ran >= STEADY_S else min(BACKOFF_MAX_S, backoff * 2)
        status.up, status.reason = False, reason
        log.warning("watch %s: down (%s); restarting in %g s", watcher.label, reason, backoff)
        await asyncio.sleep(backoff)
        status.restarts += 1


async def run_until_cancelled(watcher: FolderWatcher) -> str | None:
    """Run a watcher as a background task: cancelling it stops the watcher the gentle way (the batch
    in flight commits, for up to STOP_GRACE_S). A first pass that fails is one logged line, and
    its message is returned."""
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        stop.set()
        await asyncio.wait([task], timeout=STOP_GRACE_S)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    except CnclipError as exc:
        log.error("watch %s: not watched: %s", watcher.label, exc.message)
        return exc.message
    return None
