"""One reconcile of a watched folder with SQL: the bulk indexer's own run (indexer/pipeline.py), given
the files to look at and the part of the folder whose vanished files are pruned.

A full pass walks the whole folder and prunes the rows under it whose files are gone; a hinted pass
looks only at the paths the events named (a folder among them is walked) and prunes only rows at or
under them. Everything else is the pipeline's rules, unchanged: a file whose size and mtime are
unchanged is not read, bytes the collection has (sha256) are never embedded again (a rename or move
only updates the row's path: same id, same vector), a changed file is re-embedded and replaces its
row, a user's deletion stays remembered, and a pruned row is not (the file coming back is indexed).
Rows of the collection outside the watched folder are never touched.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from indexer.index_summary import IndexSummary, ProgressCallback
from indexer.pipeline import ImageIndexer
from indexer.service import CollectionService
from indexer.sources import SourceEntry, folder_entry, walk_folder, walked_by

Scope = Callable[[str], bool]  # which rows' paths a pass may prune


def under(folders: Iterable[str]) -> Scope:
    """Paths equal to one of `folders` or inside one."""
    exact = set(folders)
    prefixes = tuple(folder.rstrip(os.sep) + os.sep for folder in exact)
    return lambda path: path in exact or path.startswith(prefixes)


def hinted_entries(top: Path, paths: Iterable[str]) -> tuple[list[SourceEntry], list[tuple[str, str]], list[str]]:
    """The entries a walk of `top` would give for these hinted paths (a folder is walked), the refused
    files, and the hinted paths themselves that a walk reaches (the prune scope). Hidden paths, paths
    outside `top` and paths behind a symlinked folder are ignored, as a walk ignores them."""
    entries: dict[str, SourceEntry] = {}
    refused: dict[str, str] = {}
    scope: list[str] = []
    for raw in sorted(set(paths)):
        path = Path(raw)
        if path == top or not walked_by(top, path):
            continue
        scope.append(raw)
        if path.is_dir() and not path.is_symlink():
            found, bad = walk_folder(top, start=path)
            entries.update((str(e.path), e) for e in found)
            refused.update(bad)
            continue
        one = folder_entry(top, path)
        if isinstance(one, SourceEntry):
            entries[raw] = one
        elif one is not None:
            refused[one[0]] = one[1]
    return list(entries.values()), list(refused.items()), scope


class FolderPass(ImageIndexer):
    """The pipeline with a scoped prune and no save of the vector store at the end of each pass (a
    server's store is caught up by each commit and saves itself; a lone watcher's is saved on exit)."""

    flush_at_end = False

    def __init__(self, service: CollectionService, collection: str, top: Path, **options: Any) -> None:
        super().__init__(service, collection, **options)
        self.top = top
        self._scope: Scope = under([str(top)])
        # Asked (from a worker thread) before rows are pruned: True keeps them for a later pass, their
        # paths in `deferred` (the watcher hints them again).
        self.hold_prunes: Callable[[], bool] = lambda: False
        self.deferred: list[str] = []
        self._listed: set[str] = set()  # the paths this pass found (existing when it started)
        self._hinted: list[str] | None = None  # a hinted pass's paths (None: a full pass)

    async def full(self, stop: asyncio.Event, on_progress: ProgressCallback | None = None) -> IndexSummary:
        """Walk the whole folder; prune rows under it whose files are gone."""
        entries, refused = await asyncio.to_thread(walk_folder, self.top)
        self._hinted = None
        return await self._pass(entries, refused, under([str(self.top)]), stop, on_progress)

    async def hinted(self, paths: Iterable[str], stop: asyncio.Event) -> IndexSummary:
        """Look at these paths only; prune rows at or under them whose files are gone."""
        entries, refused, scope = await asyncio.to_thread(hinted_entries, self.top, list(paths))
        self._hinted = scope
        return await self._pass(entries, refused, under(scope), stop, None)

    async def _pass(
        self,
        entries: list[SourceEntry],
        refused: list[tuple[str, str]],
        scope: Scope,
        stop: asyncio.Event,
        on_progress: ProgressCallback | None,
    ) -> IndexSummary:
        started = time.perf_counter()
        self.undated, self.unhashed, self.copies = [], [], []  # per run in the pipeline: per pass here
        self.deferred = []
        self._scope = scope
        self._listed = {str(entry.path) for entry in entries} | {path for path, _ in refused}
        report = on_progress or (lambda _summary: None)
        summary = IndexSummary(total=len(entries) + len(refused), failures=list(refused))
        await self._real_run(entries, summary, stop, report, prune=True)
        self.restore_deleted = False  # `--restore-deleted` is for the first pass only
        summary.interrupted = stop.is_set()
        summary.seconds = time.perf_counter() - started
        report(summary)
        return summary

    def _prune(self) -> int:
        if self._hinted is not None and all(os.path.lexists(p) and not os.path.isdir(p) for p in self._hinted):
            return 0  # every hinted path is a file that exists: no row at or under one can be gone
        states = self.service.file_states(self.collection)
        gone = {path: state.id for path, state in states.items() if self._scope(path) and not os.path.exists(path)}
        # A file this pass listed and that is gone now moved (or went) while the pass ran, and so did
        # any when hints arrived meanwhile: the new path may be among them, so these rows wait for the
        # pass that finds it (which updates their paths: same item) or for the next one.
        self.deferred = sorted(path for path in gone if path in self._listed)
        if gone and self.hold_prunes():
            self.deferred = sorted(gone)
        for path in self.deferred:
            del gone[path]
        self.service.prune_copies(self.collection)
        return self.service.delete_items(list(gone.values()), reason="pruned") if gone else 0
