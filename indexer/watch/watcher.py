"""Watched folders: `cnclip index PATH --collection NAME --watch`, and `cnclip serve` with `CNCLIP_WATCH`.

A watcher reconciles a folder with SQL whenever something may have changed, through the bulk
indexer's own rules (indexer/watch/passes.py):

1. It takes the folder's lock (indexer/watch/lock.py); a second watcher of the same folder and
   collection says so in one line and stands by until the first stops.
2. A full pass: what changed while nobody watched (a restart after kill -9 resumes here: every batch
   is one SQL transaction, so what was committed is kept and what was not is read again).
3. Events (inotify via watchfiles; polling on network filesystems or past the inotify watch limit,
   indexer/watch/events.py) are hints: each hinted path waits until its size and mtime have been
   still for the quiet period (indexer/watch/debounce.py), then the settled paths are reconciled in one
   hinted pass. A periodic full pass (`--rescan-interval`) catches whatever no event named.
4. The folder is pinned (indexer/watch/root.py): its device and inode, walked from its descriptor.
   A folder that vanishes, is renamed away, or is replaced at its path (by a symlink to another
   folder, by another folder: `mv photos photos.real; ln -s /elsewhere photos`) is not taken for a
   folder whose files were all deleted: the watcher says so in one line and reads, indexes and
   prunes nothing until the pinned folder is back at its path (then it rescans). A new folder put at
   the path is never adopted silently: watching it takes a restart (the line says so).
5. Unreadable is not deleted: a folder the watcher may not open is skipped with one line, and
   nothing under it is pruned. The data dir, when it lies inside the folder, is never walked.

Stopping (`stop` set: Ctrl-C, SIGTERM, a server shutting down) lets the pass in flight finish its
batches; a pass cut short by cancellation loses only its uncommitted batch (SQL rolls it back).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from indexer.bulk.pipeline import ImageIndexer
from indexer.bulk.sources import identities
from indexer.domain.index_summary import IndexSummary, ProgressCallback
from indexer.fs.file_names import printable
from indexer.service.collections import CollectionService
from indexer.watch.debounce import QuietPaths
from indexer.watch.events import filesystem_type, inotify_hints, needs_polling, poll_hints
from indexer.watch.health import WatcherHealth
from indexer.watch.lock import FolderLock
from indexer.watch.passes import FolderPass
from indexer.watch.root import Identity, PinnedRoot, RootMoved, RootState
from indexer.watch.settings import WatchTuning
from retrieval.errors import CnclipError

log = logging.getLogger(__name__)

RETRY_S = 5.0  # after a failed pass (database down…) or while the folder is gone
STANDBY_S = 1.0  # how often a standing-by watcher tries the lock
# One early rescan after the first pass: a file created between the pass's walk and the event source
# being ready (watchfiles sets its inotify watches up in its own thread; polling takes its first
# snapshot) sent no hint, and would otherwise wait for the periodic rescan.
SETTLE_S = 3.0
STOP_GRACE_S = 30.0  # a server's shutdown waits this long for the batch in flight
EventMode = Literal["auto", "poll", "off"]  # off: rescans only
PassReport = Callable[[str, IndexSummary], None]  # ("first" | "full" | "hinted", what the pass did)


@dataclass(frozen=True)
class WatchOptions:
    quiet_s: float = 1.0
    rescan_interval_s: float = 300.0
    poll_interval_s: float = 2.0
    events: EventMode = "auto"

    @classmethod
    def from_settings(cls, settings: WatchTuning, **overrides: Any) -> WatchOptions:
        values: dict[str, Any] = {
            "quiet_s": settings.watch_quiet_s,
            "rescan_interval_s": settings.watch_rescan_interval_s,
            "poll_interval_s": settings.watch_poll_interval_s,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


async def rest(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less when `stop` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=max(0.0, seconds))


class FolderWatcher:
    """Keeps one collection in step with one folder until `stop` is set."""

    def __init__(
        self,
        service: CollectionService,
        collection: str,
        folder: Path,
        options: WatchOptions,
        data_dir: Path,
        *,
        on_pass: PassReport | None = None,
        pipeline: ImageIndexer | None = None,
        **indexer_options: Any,
    ) -> None:
        """`pipeline`: the bulk indexer the passes run (`ImageIndexer.from_settings`); None: one made
        with `indexer_options`."""
        self.service = service
        self.collection = collection
        self.folder = folder
        self.options = options
        self.lock_dir = data_dir / "watch"
        self.data_dir = data_dir
        # The catalog's own files change with every pass: hints from there would start pass after pass.
        self.ignored = str(data_dir.resolve()) + os.sep
        self.on_pass = on_pass
        self.pipeline = pipeline or ImageIndexer(service, collection, **indexer_options)
        self.mode = "starting"  # how changes are seen: inotify, polling, rescans only
        self.quiet = QuietPaths(options.quiet_s)
        self._wake = asyncio.Event()
        self._state = RootState.HERE  # the pinned folder's state, as last said
        self.health: WatcherHealth | None = None  # a server's watcher says how it is doing there
        self._unreadable: set[str] = set()  # folders said to be unreadable (said again once readable)
        self._returned = False  # the folder came back: watch it anew
        self._next_full = 0.0
        self._reported: set[tuple[str, str]] = set()

    @property
    def label(self) -> str:
        return f"{printable(str(self.folder))} → {self.collection}"

    async def run(self, stop: asyncio.Event, first_progress: ProgressCallback | None = None) -> IndexSummary | None:
        """Watch until `stop`; returns the first pass's summary (None when stopped before it ran).
        The first pass's errors are raised (a wrong collection, the model unavailable); later ones
        are logged and the pass retried."""
        root = await self._wait_for_folder(stop)
        if root is None:
            return None
        self.root = root  # the folder watched from now on, whatever its name becomes
        self.top = root.path
        lock = FolderLock(self.lock_dir, self.collection, self.top)
        if not await self._take(lock, stop):
            return None
        self.passes = FolderPass(self.pipeline, self.root, skip=self._product_folders(), quiet_s=self.options.quiet_s)
        self.passes.hold_prunes = self.quiet.any_present  # hints arrived during the pass (a read only)
        self._start_pump()
        try:
            try:
                first = await self.passes.full(stop, first_progress)
            except RootMoved as exc:  # swapped between the pin and the walk
                self._said(exc.state)
                first = IndexSummary()
            self._rehint_deferred()
            self._report("first", first)
            if not first.interrupted:
                await self._loop(stop)
            return first
        finally:
            await self._stop_pump()
            lock.release()

    # --- before the first pass ---------------------------------------------------------------------
    async def _wait_for_folder(self, stop: asyncio.Event) -> PinnedRoot | None:
        """The folder, pinned once it is one (None: stopped before)."""
        said = False
        while not stop.is_set():
            try:
                return PinnedRoot.pin(self.folder)
            except OSError:
                if not said:
                    log.warning("watch %s: not a folder (yet); waiting for it", self.label)
                    said = True
            await rest(stop, RETRY_S)
        return None

    def _product_folders(self) -> frozenset[Identity]:
        """The folders the product writes (the data dir: uploads' copies, thumbnails, the catalog),
        by identity: a walk never enters them, wherever they lie and whatever leads to them."""
        return identities([self.data_dir])

    async def _take(self, lock: FolderLock, stop: asyncio.Event) -> bool:
        if lock.try_acquire():
            return True
        log.warning(
            "watch %s: another process (pid %s) watches this folder; standing by to take over when it stops",
            self.label,
            lock.holder(),
        )
        while not stop.is_set():
            await rest(stop, STANDBY_S)
            if lock.try_acquire():
                log.warning("watch %s: the other watcher stopped; taking over", self.label)
                return True
        return False

    # --- hints -----------------------------------------------------------------------------------
    def _hint(self, paths: set[str]) -> None:
        now = time.monotonic()
        prefix = str(self.top) + os.sep
        for path in paths:
            if path.startswith(self.ignored) or not path.startswith(prefix):
                continue
            if not any(part.startswith(".") for part in path[len(prefix) :].split(os.sep)):
                self.quiet.hint(path, now)
        self._wake.set()

    def _start_pump(self) -> None:
        self._pump_stop = asyncio.Event()
        self._pump_task = asyncio.create_task(self._pump(self._pump_stop), name=f"cnclip:watch:{self.collection}")
        self._pump_task.add_done_callback(self._pump_ended)

    def _pump_ended(self, task: asyncio.Task[None]) -> None:
        """An event source that fails in a way `_pump` does not expect is said, not lost: rescans go on."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("watch %s: the event source failed (%r); only rescans see changes now", self.label, exc)
            self.mode = "rescans only"

    async def _stop_pump(self) -> None:
        self._pump_stop.set()
        self._pump_task.cancel()
        await asyncio.gather(self._pump_task, return_exceptions=True)

    async def _pump(self, stop: asyncio.Event) -> None:
        """Feed hints from the kernel's events, or from polling where those cannot see."""
        mode = self.options.events
        fs_type = filesystem_type(self.top)
        if mode == "auto" and needs_polling(fs_type):
            log.warning(
                "watch %s: on %s, where inotify does not see changes made by other machines: polling every %g s",
                self.label,
                fs_type,
                self.options.poll_interval_s,
            )
            mode = "poll"
        if mode == "auto":
            try:
                self.mode = "inotify"
                async for paths in inotify_hints(self.top, stop):
                    self._hint(paths)
                return
            # No watchfiles; the watch limit reached (or another setup failure); watchfiles' own errors,
            # e.g. a file name that is not UTF-8 (raised inside anyio's task group, so as a group).
            except (ImportError, OSError, RuntimeError, ExceptionGroup) as exc:
                log.warning(
                    "watch %s: inotify cannot watch it (%s): polling every %g s instead",
                    self.label,
                    _innermost(exc),
                    self.options.poll_interval_s,
                )
                self._next_full = 0.0  # what happened meanwhile: one full pass
                self._wake.set()
        if mode == "off":
            self.mode = "rescans only"
            return
        self.mode = "polling"
        async for paths in poll_hints(self.top, self.options.poll_interval_s, stop):
            self._hint(paths)

    # --- the loop --------------------------------------------------------------------------------
    async def _loop(self, stop: asyncio.Event) -> None:
        self._next_full = time.monotonic() + min(SETTLE_S, self.options.rescan_interval_s)
        while not stop.is_set():
            now = time.monotonic()
            due = self.quiet.next_due(now)
            wait = self._next_full - now if due is None else min(due, self._next_full - now)
            await self._sleep(stop, wait)
            if stop.is_set():
                return
            if not self._present():
                await rest(stop, RETRY_S)
                continue
            if self._returned:  # back after being gone: its inotify watches went with it
                self._returned = False
                await self._stop_pump()
                self._start_pump()
            if time.monotonic() >= self._next_full:
                self._next_full = time.monotonic() + self.options.rescan_interval_s
                await self._guarded("full", functools.partial(self.passes.full, stop))
                continue
            settled = self._settled()
            if settled:
                await self._guarded("hinted", functools.partial(self.passes.hinted, settled, stop))

    def _settled(self) -> list[str]:
        """The settled paths to reconcile now. A move is a path that vanished and one that appeared,
        whose hints may settle apart (a folder's own hint, a file still arriving): while paths that
        exist still wait, vanished ones wait with them, so that the pass that finds the bytes at their
        new path updates the row (same id, same vector) before any pass could prune it."""
        now = time.monotonic()
        settled = self.quiet.settled(now)
        if not self.quiet.any_present():
            return settled
        vanished = {path for path in settled if not os.path.lexists(path)}
        for path in vanished:
            self.quiet.hint(path, now)
        return [path for path in settled if path not in vanished]

    async def _sleep(self, stop: asyncio.Event, seconds: float) -> None:
        """Until a hint arrives, `stop` is set or `seconds` pass."""
        if seconds <= 0:
            return
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        self._wake.clear()

    def _present(self) -> bool:
        """Whether the pinned folder is at its path (else nothing is read or pruned)."""
        return self._said(self.root.state())

    def _said(self, state: RootState) -> bool:
        """Say a change of the folder's state, in one line; whether it is here."""
        if state is not self._state:
            if state is RootState.HERE:
                log.warning("watch %s: the folder is back; rescanning it", self.label)
                self._next_full = 0.0
                self._returned = True
            elif state is RootState.GONE:
                log.warning("watch %s: the folder is gone or unmounted; nothing is pruned until it is back", self.label)
            elif state is RootState.UNREADABLE:
                log.warning("watch %s: the folder cannot be read; nothing is pruned until it can", self.label)
            else:
                log.warning(
                    "watch %s: the folder was replaced (by a symlink, a file or another folder): stopped; nothing "
                    "is read or pruned through it. Watching resumes if the original folder comes back to this "
                    "path; restart the watcher to watch the new one",
                    self.label,
                )
            self._state = state
            if self.health is not None:
                self.health.folder_here = state is RootState.HERE
        return state is RootState.HERE

    def _say_unreadable(self, kind: str) -> None:
        """One line per folder a pass could not read (kept as it was: nothing under it pruned); a full
        pass says which are readable again, so one that becomes unreadable again is said again."""
        found = set(self.passes.unreadable)
        now = found if kind in ("first", "full") else self._unreadable | found
        for path in sorted(found - self._unreadable)[:20]:
            log.warning(
                "watch %s: cannot read %s (%s): skipped; nothing under it is pruned while it stays unreadable",
                self.label,
                printable(path),
                self.passes.unreadable[path],
            )
        self._unreadable = now

    async def _guarded(self, kind: str, make: Callable[[], Awaitable[IndexSummary]]) -> None:
        """Run one pass; a project error (the database away…) is one line, and a full pass follows."""
        try:
            summary = await make()
        except RootMoved as exc:  # swapped during the pass: stopped before its next write
            self._said(exc.state)
            self._next_full = time.monotonic() + RETRY_S
            return
        except CnclipError as exc:
            log.warning("watch %s: a %s pass failed (%s); rescanning in %g s", self.label, kind, exc.message, RETRY_S)
            self._next_full = time.monotonic() + RETRY_S
            return
        self._rehint_deferred()
        self._report(kind, summary)

    def _rehint_deferred(self) -> None:
        now = time.monotonic()
        for path in self.passes.deferred:
            self.quiet.hint(path, now)

    def _report(self, kind: str, summary: IndexSummary) -> None:
        self._say_unreadable(kind)
        new = [f for f in summary.failures if f not in self._reported]
        for where, why in new[:20]:
            log.warning("watch %s: bad file %s: %s", self.label, printable(where), printable(why))
        if len(self._reported) > 100_000:
            self._reported.clear()
        self._reported.update(new)
        if summary.added or summary.changed or summary.renamed or summary.pruned or kind == "first":
            log.info(
                "watch %s: %d new, %d changed, %d renamed, %d pruned, %d failed (%s pass, %.2f s)",
                self.label, summary.added, summary.changed, summary.renamed, summary.pruned,
                len(summary.failures), kind, summary.seconds,
            )  # fmt: skip
        if self.on_pass is not None:
            self.on_pass(kind, summary)


def _innermost(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (what actually went wrong), or `exc` itself."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
