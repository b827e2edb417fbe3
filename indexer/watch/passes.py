"""One reconcile of a watched folder with SQL: a run of the bulk indexer (indexer/bulk/pipeline.py, its
`IndexRun`), given the files to look at and the part of the folder whose vanished files are pruned.

A full pass walks the whole folder and prunes the rows under it whose files are gone; a hinted pass
looks only at the paths the events named (a folder among them is walked) and prunes only rows at or
under them. Everything else is the pipeline's rules, unchanged: a file whose size and mtime are
unchanged is not read, bytes the collection has (sha256) are never embedded again (a rename or move
only updates the row's path: same id, same vector), a changed file is re-embedded and replaces its
row, a user's deletion stays remembered, and a pruned row is not (the file coming back is indexed).
Rows of the collection outside the watched folder are never touched.

Walks start from the watched folder's pinned descriptor (indexer/watch/root.py); every commit and
the prune check first that the folder at its path is still the pinned one, and a file that changed
within the quiet period is read only once it stays still (full passes too: a file being written is
never read half-done by a rescan).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterable

from indexer.bulk.moves import UNDECIDED
from indexer.bulk.pipeline import ImageIndexer, IndexRun
from indexer.bulk.sources import SourceEntry
from indexer.domain.index_summary import IndexSummary, ProgressCallback
from indexer.watch.root import Identity, PinnedRoot, Walk

Scope = Callable[[str], bool]  # which rows' paths a pass may prune


def under(folders: Iterable[str]) -> Scope:
    """Paths equal to one of `folders` or inside one."""
    exact = set(folders)
    prefixes = tuple(folder.rstrip(os.sep) + os.sep for folder in exact)
    return lambda path: path in exact or path.startswith(prefixes)


class FolderPass:
    """A watched folder's passes, each a run of `pipeline` with a scoped prune, a check of the pinned
    folder before every write, and no save of the vector store at the end (a server's store is caught
    up by each commit and saves itself; a lone watcher's is saved on exit)."""

    def __init__(
        self,
        pipeline: ImageIndexer,
        root: PinnedRoot,
        *,
        skip: frozenset[Identity] = frozenset(),
        quiet_s: float = 0.0,
    ) -> None:
        self.pipeline = pipeline
        self.service = pipeline.service
        self.collection = pipeline.collection
        self.restore_deleted = pipeline.restore_deleted  # `--restore-deleted` is for the first pass only
        self.root = root
        self.top = root.path
        self.skip = skip  # folders never walked (the data dir: the product's own files)
        self.quiet_s = quiet_s  # a file changed this recently may be still being written: not read yet
        self.unreadable: dict[str, str] = {}  # what the last walk could not read (kept, not pruned)
        self._scope: Scope = under([str(self.top)])
        self._still_moving = False  # this pass deferred a file: its prunes wait too (it may be a move's end)
        self._moved_meanwhile = False  # hints arrived while this pass planned its moves (`_folder_moving`)
        # Asked (from a worker thread) before rows are pruned: True keeps them for a later pass, their
        # paths in `deferred` (the watcher hints them again).
        self.hold_prunes: Callable[[], bool] = lambda: False
        self.deferred: list[str] = []
        self._listed: set[str] = set()  # the paths this pass found (existing when it started)
        self._hinted: list[str] | None = None  # a hinted pass's paths (None: a full pass)

    async def full(self, stop: asyncio.Event, on_progress: ProgressCallback | None = None) -> IndexSummary:
        """Walk the whole folder; prune rows under it whose files are gone."""
        found, _ = await asyncio.to_thread(self.root.walk, None, skip=self.skip, quiet_s=self.quiet_s)
        self._hinted = None
        return await self._pass(found, under([str(self.top)]), stop, on_progress)

    async def hinted(self, paths: Iterable[str], stop: asyncio.Event) -> IndexSummary:
        """Look at these paths only; prune rows at or under them whose files are gone."""
        found, scope = await asyncio.to_thread(self.root.walk, list(paths), skip=self.skip, quiet_s=self.quiet_s)
        self._hinted = scope
        return await self._pass(found, under(scope), stop, None)

    async def _pass(
        self, found: Walk, scope: Scope, stop: asyncio.Event, on_progress: ProgressCallback | None
    ) -> IndexSummary:
        started = time.perf_counter()
        self.unreadable = found.unreadable
        settled, moving = await self._settle(found.recent, stop)
        entries = found.entries + settled
        self.deferred = []
        self._still_moving = bool(moving)
        self._moved_meanwhile = False
        refused = found.refused
        self._scope = scope
        self._listed = {str(entry.path) for entry in entries} | {path for path, _ in refused} | set(moving)
        report = on_progress or (lambda _summary: None)
        summary = IndexSummary(total=len(entries) + len(refused), failures=list(refused))
        run = self.pipeline.new_run(
            summary,
            stop,
            report,
            restore_deleted=self.restore_deleted,
            prune=self._prune,
            before_write=self._before_write,
            folder_moving=self._folder_moving,
            flush=False,
        )
        await self.pipeline.index(entries, run)
        self.restore_deleted = False
        # Moves that wait because the folder moved meanwhile (indexer/bulk/moves.py) are looked at again soon
        # (those that wait for an unreadable file, at the next full pass: they would only wait again).
        undecided = {path for path, why in summary.failures if why == UNDECIDED} if self._moved_meanwhile else set()
        self.deferred = sorted(set(self.deferred) | set(moving) | undecided)  # the watcher hints them again
        summary.interrupted = stop.is_set()
        summary.seconds = time.perf_counter() - started
        report(summary)
        return summary

    async def _settle(
        self, recent: list[tuple[SourceEntry, tuple[int, int, int]]], stop: asyncio.Event
    ) -> tuple[list[SourceEntry], list[str]]:
        """Files that changed within the quiet period: looked at again one quiet period later; those
        still the same are read now, the others (still being written) are left to the watcher's
        quiet paths (indexer/watch/debounce.py), which read them once they are still."""
        if not recent:
            return [], []
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=self.quiet_s)
        still, moving = [], []
        for entry, before in recent:
            try:
                info = os.stat(entry.path)
            except OSError:
                moving.append(str(entry.path))  # gone meanwhile: its hint decides
                continue
            if (info.st_size, info.st_mtime_ns, info.st_ino) == before:
                still.append(entry)
            else:
                moving.append(str(entry.path))
        return still, moving

    def _before_write(self) -> None:
        """Every write of a pass (a batch, a move, the pass's moves by content) is made only while the
        watched folder is still the pinned one: a folder swapped (for a link to another folder, for
        another folder) during the pass is never indexed through, and the pass stops (`RootMoved`)
        with nothing of the batch in hand committed."""
        self.root.check()

    def _folder_moving(self) -> bool:
        """Hints arrived during the pass (a rename storm): the bytes of an item this pass found nowhere
        may be at a path it did not look at; that item waits (its path is hinted again)."""
        self._moved_meanwhile = self._moved_meanwhile or self.hold_prunes()
        return self._moved_meanwhile

    def _prune(self, _run: IndexRun) -> int:
        """The one place a watcher decides what to prune: rows in this pass's scope whose files the
        pinned folder says are gone (indexer/watch/root.py: unreadable is not gone), decided from
        the pinned folder and committed only after checking again that it is still at its path."""
        if self._hinted is not None and all(os.path.lexists(p) and not os.path.isdir(p) for p in self._hinted):
            return 0  # every hinted path is a file that exists: no row at or under one can be gone
        states = self.service.file_states(self.collection)
        gone_paths = self.root.gone(path for path in states if self._scope(path))
        gone = {path: states[path].id for path in gone_paths}
        # A file this pass listed and that is gone now moved (or went) while the pass ran, and so did
        # any when hints arrived meanwhile or when this pass left a file still being written: the new
        # path may be among them, so these rows wait for the pass that finds it (which updates their
        # paths: same item) or for the next one.
        self.deferred = sorted(path for path in gone if path in self._listed)
        if gone and (self.hold_prunes() or self._still_moving):
            self.deferred = sorted(gone)
        for path in self.deferred:
            del gone[path]
        self.root.check()  # right before the prune commits: the folder decided on is still the one watched
        self.service.duplicates.prune_copies(self.collection)
        return self.service.delete_items(list(gone.values()), reason="pruned") if gone else 0
