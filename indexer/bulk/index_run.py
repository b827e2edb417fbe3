"""One run of the bulk pipeline (indexer/bulk/pipeline.py): a `cnclip index`, or one pass of a folder
watcher (indexer/watch/passes.py). The pipeline makes one per run, so nothing a run learns (the files
to date or hash, the copies it found) is left over for the next; a watcher's pass brings its own prune
and the checks it makes before each write, instead of subclassing the pipeline and resetting its
fields by hand. And the plan every run starts with: which files need reading."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from indexer.bulk.moves import unchanged
from indexer.bulk.raw_companions import raw_companions
from indexer.bulk.sources import SourceEntry
from indexer.bulk.stage_clock import StageClock
from indexer.domain.duplicates import FileCopy
from indexer.domain.index_summary import IndexSummary, ProgressCallback
from indexer.domain.records import CollectionState, FileState
from indexer.fs.presence import gone_error

Todo = list[tuple[SourceEntry, FileState | None]]  # the files to read, each with its row's state (None: new)


def _nothing() -> None:
    return None


def _never() -> bool:
    return False


@dataclass
class IndexRun:
    """What one run is given and what it learns while it runs."""

    target: CollectionState  # the collection as the run found it (`ensure`): its vectors get its generation
    summary: IndexSummary
    stop: asyncio.Event
    report: ProgressCallback
    restore_deleted: bool = False  # forget the collection's remembered deletions first
    prune: Callable[[IndexRun], int] | None = None  # after the run: prunes rows, says how many (None: none)
    before_write: Callable[[], None] = _nothing  # before every write (a watcher: the folder is still the pinned one)
    folder_moving: Callable[[], bool] = (
        _never  # whether the folder changed while the run read it (indexer/bulk/moves.py)
    )
    flush: bool = True  # save the vector store at the end (a watcher's passes leave it to the store's own saves)
    undated: list[SourceEntry] = field(default_factory=list)  # unchanged files whose rows have no taken_at
    unhashed: list[SourceEntry] = field(default_factory=list)  # unchanged files whose rows have no perceptual hash
    copies: list[FileCopy] = field(default_factory=list)  # files with the bytes of an item at another path
    clock: StageClock = field(init=False)  # times the stages into `summary.stages`

    def __post_init__(self) -> None:
        self.clock = StageClock(self.summary.stages)


def plan(
    entries: list[SourceEntry], states: dict[str, FileState], summary: IndexSummary
) -> tuple[Todo, list[SourceEntry], list[SourceEntry]]:
    """Files that need reading: new ones and those whose size or mtime changed; and of the unchanged
    ones, those whose rows have no date and those with no perceptual hash (the backfills'). A RAW
    beside a rendered image of the same shot is counted, not read (indexer/bulk/raw_companions.py)."""
    todo: Todo = []
    undated: list[SourceEntry] = []
    unhashed: list[SourceEntry] = []
    companions = raw_companions(entries)
    for entry in entries:
        if entry.path in companions:
            summary.raw_companions += 1
            continue
        state = states.get(str(entry.path))
        try:
            stat = entry.path.stat()
        except OSError as exc:  # a walked file gone since the walk (renamed on): the prune decides
            if entry.listed or not gone_error(exc):
                summary.failures.append((str(entry.path), f"cannot read: {exc.strerror or exc}"))
            continue
        if state is not None and unchanged(state, stat):
            summary.unchanged += 1
            if not state.has_taken:
                undated.append(entry)
            if not state.has_phash:
                unhashed.append(entry)
        else:
            todo.append((entry, state))
    return todo, undated, unhashed
