"""Moves by content: what one pass of `cnclip index` (or of a folder watcher) settles before it reads
anything for the encoder.

A file whose bytes are still present under another path is a move, whatever names the other files
now have: a photo tool renumbering IMG_0001…IMG_0030 (each name takes its neighbour's bytes), two
names swapped, a cycle A→B→C→A. Routing file by file (indexer/bulk/routing.py) cannot see that: when
IMG_0001 is read with IMG_0002's bytes, IMG_0002 still exists, so the bytes look like a copy, and
IMG_0001's own item looks replaced. So, once per pass and before anything is marked replaced:

1. The *displaced* items: those whose path is in the pass with other bytes now (its size differs
   from the recorded one, or it hashes differently). A path that cannot be read is not displaced.
2. The files that had an item (a touch, an edit, another item's bytes now: the pass reads them
   anyway) and those that could hold a displaced item's bytes (their size is one of those items'
   sizes; a size that differs cannot hold the same bytes) are read and hashed. A file
   with the bytes of an item whose path is not in the pass, and changed since it was recorded, brings
   that path into the pass (a watcher's hints may name one name of a swap before the other).
3. Each displaced item whose bytes are found at another path of the pass moves there (the first such
   path in sorted order; the others are copies); failing that, at a recorded copy (indexer/
   duplicate_rows.py) that still holds them — a watcher's earlier pass may have met the bytes first.
4. An item displaced from a path another item moves to, whose own bytes are nowhere, is replaced.
   An item displaced from a path no item moves to stays for the pipeline's routing: its new bytes
   are embedded and replace it, as before (a real change).

The moves (and the touched files' new mtime) are written in one transaction (indexer/storage/sql/move_rows.py);
the files they settled are not read again, and the paths their items left are new paths to the
collection. A dry run plans the same way without writing, so it counts what a real run does.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from indexer.bulk.reading import PreparedFile, read_file
from indexer.bulk.sources import SourceEntry
from indexer.domain.duplicates import FileCopy
from indexer.domain.records import FileMoves, FileState
from indexer.fs.presence import file_gone, row_gone

if TYPE_CHECKING:
    from indexer.domain.index_summary import IndexSummary
    from indexer.service.collections import CollectionService

Todo = list[tuple[SourceEntry, FileState | None]]
Reader = Callable[[SourceEntry, FileState | None], PreparedFile | tuple[str, str] | None]
CopiesOf = Callable[[Sequence[str]], dict[str, list[FileCopy]]]
UNDECIDED = "not indexed yet: a file this run could not read (or that moved while it was read) may hold the bytes of this path's item"
Known = Callable[[Sequence[str]], dict[str, tuple[str, FileState]]]  # sha256 -> (path, state) of indexed files


@dataclass
class MovePlan:
    """What a pass settles by content; `todo`: what is left for the pipeline to read."""

    todo: Todo
    moves: FileMoves = field(default_factory=FileMoves)
    renamed: int = 0  # items moved to another path
    touched: int = 0  # files read with the bytes of their own item (a touch): new mtime only
    located: dict[str, tuple[int, str]] = field(default_factory=dict)  # sha256 -> (item id, new path)
    undecided: list[str] = field(default_factory=list)  # paths left for the next run (see `_blocked`)

    def follow(self, contents: dict[str, tuple[int, str | None]]) -> None:
        """Update a router's sha256 -> (item id, path) with the moves (the dry run, which writes none)."""
        contents.update(self.located)


def unchanged(state: FileState, stat: os.stat_result) -> bool:
    """Whether a file may be taken to hold its recorded bytes without reading it: the size and mtime it
    was recorded with, and no change to its inode since (a same-size rewrite with the old mtime put
    back still moves st_ctime, which `utime` cannot set; a false alarm costs one read, the hash then
    decides)."""
    recorded = state.recorded_at is None or stat.st_ctime <= state.recorded_at
    return state.size == stat.st_size and state.mtime == stat.st_mtime and recorded


def plan_moves(
    todo: Todo,
    read: Reader,
    copies_of: CopiesOf | None = None,
    threads: int = 2,
    known: Known | None = None,
    halted: Callable[[], bool] = lambda: False,
    moving: Callable[[], bool] = lambda: False,
) -> MovePlan:
    """The moves of one pass (see the module docstring); `read` reads and hashes one file, `copies_of`
    gives the recorded copies of some bytes, `known` the indexed files with some bytes (sha256 -> (path,
    state)): a file of the pass with the bytes of an item whose path is not in the pass and changed
    brings that path into the pass (a watcher's hints may name one side of a swap first). A run
    stopped meanwhile (`halted`) plans nothing: half a survey could take a moved item for replaced.
    `moving`: whether the folder changed while the pass ran (a watcher's hints arrived meanwhile): an
    item found nowhere may then lie at a path this pass did not look at, so none is replaced."""
    stateful = {str(entry.path): state for entry, state in todo if state is not None}
    if not stateful:
        return MovePlan(todo)  # no path of the pass had an item: nothing can be displaced
    survey = _Survey(read, threads, halted)
    todo = list(todo)
    survey.stat(todo)
    vanished: dict[str, FileState] = {}  # items whose path is gone, whose bytes a file of the pass holds
    while True:
        survey.hash(todo, {state.size for state in stateful.values()})
        extra, gone = _neighbours(survey, stateful, known, vanished) if known is not None else ([], {})
        if not extra and not gone:
            break
        vanished.update(gone)
        survey.stat(extra)
        todo += extra
        stateful.update((str(entry.path), state) for entry, state in extra if state is not None)
    if halted():
        return MovePlan(todo)
    hashed, now = survey.hashed, survey.now
    displaced = {
        path: state
        for path, state in stateful.items()
        if (path in hashed and hashed[path].sha256 != state.sha256)
        or (path not in hashed and now.get(path, state.size) != state.size)
    } | vanished
    by_sha: dict[str, list[PreparedFile]] = {}
    for path in sorted(hashed):
        by_sha.setdefault(hashed[path].sha256, []).append(hashed[path])
    targets: dict[int, PreparedFile] = {}
    for path, state in displaced.items():
        found = [p for p in by_sha.get(state.sha256, []) if str(p.entry.path) != path]
        if found:
            targets[state.id] = found[0]
    lost = {state.sha256: state for state in displaced.values() if state.id not in targets}
    if lost and copies_of is not None:
        targets.update(_at_copies(lost, copies_of(sorted(lost)), survey.paths, read))
    blocked = _blocked(displaced, targets, survey.unread, moving=survey.moving() or moving())
    return _plan(todo, stateful, hashed, displaced, targets, blocked)


def _blocked(
    displaced: dict[str, FileState], targets: dict[int, PreparedFile], unread: dict[str, int], moving: bool = False
) -> set[str]:
    """The paths this pass leaves alone because a file it could not read (EACCES, EIO) may hold the
    bytes of a displaced item that was found nowhere else (its size is theirs): unreadable is not
    deleted, so that item is not replaced, no item moves onto its path, and an item that therefore
    cannot move keeps its path too. Drops those moves from `targets`; the next pass decides.
    `moving`: files of the pass were renamed or rewritten while it read them (a rename storm): what
    it found nowhere may have been read under another name, so no displaced item found nowhere is
    replaced by this pass either."""
    sizes = set(unread.values())
    blocked = {path for path, state in displaced.items() if state.id not in targets and (moving or state.size in sizes)}
    where = {state.id: path for path, state in displaced.items()}
    while cancelled := [item for item, prepared in targets.items() if str(prepared.entry.path) in blocked]:
        for item_id in cancelled:
            del targets[item_id]
            blocked.add(where[item_id])
    return blocked


class _Survey:
    """The files of a pass: their sizes now, and those that may hold a displaced item's bytes read and
    hashed (their bytes dropped: a move needs none)."""

    def __init__(self, read: Reader, threads: int, halted: Callable[[], bool]) -> None:
        self.read = read
        self.halted = halted
        self.threads = max(1, threads)
        self.paths: set[str] = set()  # every path of the pass
        self.now: dict[str, int] = {}  # path -> st_size (absent: stat failed)
        self.hashed: dict[str, PreparedFile] = {}
        self.unread: dict[str, int] = {}  # path -> size of the files that could not be read (EACCES, EIO)
        self._tried: set[str] = set()
        self._seen: dict[str, tuple[int, ...]] = {}  # path -> (device, inode, size, mtime, ctime) first seen

    def stat(self, todo: Todo) -> None:
        for entry, _ in todo:
            self.paths.add(str(entry.path))
            with contextlib.suppress(OSError):
                info = entry.path.stat()
                self.now[str(entry.path)] = info.st_size
                self._seen[str(entry.path)] = _identity(info)

    def moving(self) -> bool:
        """Whether a file of the pass is another one now (renamed over, rewritten, gone) than when the
        pass first looked at it: then what the pass read is no snapshot of the folder."""
        for path, seen in self._seen.items():
            try:
                info = os.stat(path)
            except OSError:
                return True
            if _identity(info) != seen:
                return True
        return False

    def hash(self, todo: Todo, sizes: set[int | None]) -> None:
        """Read the files that had an item (what they hold now may be another item's bytes) and those
        whose size is one of `sizes` (a size that differs cannot hold the same bytes)."""
        due = [
            (entry, state)
            for entry, state in todo
            if str(entry.path) not in self._tried
            and str(entry.path) in self.now
            and (state is not None or self.now[str(entry.path)] in sizes)
        ]
        self._tried.update(str(entry.path) for entry, _ in due)
        with ThreadPoolExecutor(self.threads, thread_name_prefix="cnclip-moves") as pool:
            for (entry, _), prepared in zip(
                due, pool.map(lambda item: None if self.halted() else self.read(*item), due), strict=True
            ):
                if isinstance(prepared, PreparedFile):
                    self.hashed[str(prepared.entry.path)] = replace(prepared, data=b"")
                elif isinstance(prepared, tuple) and prepared[1].startswith("cannot read"):
                    self.unread[str(entry.path)] = self.now[str(entry.path)]


def _identity(info: os.stat_result) -> tuple[int, ...]:
    """What changes when a file is renamed over (inode; a rename moves st_ctime too, so a swap and its
    swap back are seen) or rewritten (size, mtime)."""
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _neighbours(
    survey: _Survey, stateful: dict[str, FileState], known: Known, vanished: dict[str, FileState]
) -> tuple[Todo, dict[str, FileState]]:
    """Paths outside the pass whose item's bytes a file of the pass holds: those that changed since
    they were recorded may hold another item's bytes now (a swap), so the pass looks at them; those
    that are gone (indexer/fs/presence.py) are displaced items (`mv b a`: b's item moves to a, in the
    same transaction as a's old item is replaced)."""
    held = {
        path: prepared
        for path, prepared in survey.hashed.items()
        if path not in stateful or stateful[path].sha256 != prepared.sha256  # not its own item's bytes
    }
    items = known(sorted({prepared.sha256 for prepared in held.values()})) if held else {}
    extra: dict[str, tuple[SourceEntry, FileState | None]] = {}
    gone: dict[str, FileState] = {}
    for prepared in held.values():
        path, state = items.get(prepared.sha256, (None, None))
        if path is None or state is None or path in survey.paths or path in extra or path in vanished:
            continue
        try:
            info = os.stat(path)
        except OSError:
            if file_gone(path):
                gone[path] = state
            continue
        if not file_gone(path) and not unchanged(state, info):
            extra[path] = (SourceEntry(Path(path), root=prepared.entry.root), state)
        elif file_gone(path):
            gone[path] = state  # a folder of that name now
    return list(extra.values()), gone


def _at_copies(
    lost: dict[str, FileState], copies: dict[str, list[FileCopy]], in_pass: set[str], read: Reader
) -> dict[int, PreparedFile]:
    """Displaced items whose bytes this pass did not find, found at a recorded copy that still holds
    them (read and hashed again: a record is only what was true then)."""
    found: dict[int, PreparedFile] = {}
    for sha, state in sorted(lost.items()):
        for copy in copies.get(sha, []):
            if copy.path in in_pass or (copy.size is not None and copy.size != state.size):
                continue
            root = Path(copy.root) if copy.root is not None else None
            prepared = read(SourceEntry(Path(copy.path), root=root), None)
            if isinstance(prepared, PreparedFile) and prepared.sha256 == sha:
                found[state.id] = replace(prepared, data=b"")
                break
    return found


def _plan(
    todo: Todo,
    stateful: dict[str, FileState],
    hashed: dict[str, PreparedFile],
    displaced: dict[str, FileState],
    targets: dict[int, PreparedFile],
    blocked: set[str],
) -> MovePlan:
    taken = {str(p.entry.path) for p in targets.values()}
    plan = MovePlan([], renamed=len(targets))
    plan.moves.replaced = sorted(
        state.id for path, state in displaced.items() if path in taken and state.id not in targets
    )  # never a blocked one: no move onto a blocked path is left
    settled = dict(targets)
    for path, own in stateful.items():  # touched: the bytes of their own item
        if path not in displaced and path in hashed and path not in taken:
            settled[own.id] = hashed[path]
            plan.touched += 1
    for item_id, prepared in sorted(settled.items()):
        path, root = str(prepared.entry.path), prepared.entry.root
        plan.moves.paths.append((item_id, path, str(root) if root is not None else None, prepared.size, prepared.mtime))
        plan.moves.dates[item_id] = prepared.taken
        plan.located[prepared.sha256] = (item_id, path)
    done = {str(p.entry.path) for p in settled.values()}
    plan.undecided = sorted(blocked & {str(entry.path) for entry, _ in todo})
    for entry, state in todo:
        if str(entry.path) in done or str(entry.path) in blocked:
            continue
        left = state is not None and state.id in targets  # its item moved away: a new path to the collection
        plan.todo.append((entry, None if left else state))
    return plan


def settle_moves(
    service: CollectionService,
    collection: str,
    todo: Todo,
    summary: IndexSummary,
    threads: int = 2,
    dry_run: dict[str, tuple[int, str | None]] | None = None,
    halted: Callable[[], bool] = lambda: False,
    write: Callable[[FileMoves], None] | None = None,
    moving: Callable[[], bool] = lambda: False,
) -> Todo:
    """Plan one pass's moves, write them (through `write`, the indexer's hook: a watcher checks its
    folder first) and count them; returns what is left to read. `dry_run`: a dry run's router contents
    (sha256 -> (item id, path)), updated with the moves instead of writing; `halted`: whether the run
    was asked to stop; `moving`: whether the folder changed meanwhile (see `plan_moves`)."""
    limit = service.max_image_bytes  # a larger file is refused unread (indexer/bulk/reading.py)
    plan = plan_moves(
        todo,
        lambda entry, state: read_file(entry, state, None, None, limit),
        lambda shas: service.moves.copies_of(collection, shas),
        threads,
        lambda shas: service.moves.files_with(collection, shas),
        halted,
        moving,
    )
    if dry_run is not None:
        plan.follow(dry_run)
    elif plan.moves:
        (write or functools.partial(service.moves.move_files, collection))(plan.moves)
    summary.renamed += plan.renamed
    summary.unchanged += plan.touched
    summary.failures += [(path, UNDECIDED) for path in plan.undecided]
    return plan.todo


def prunable(states: dict[str, FileState], contents: dict[str, tuple[int, str | None]]) -> int:
    """How many of `states` (path -> item, as a pass found them) a prune deletes after the pass: their
    file is gone (indexer/fs/presence.py), and their item did not move to a path that is there
    (`contents`: sha256 -> (item id, path) after the pass's moves and renames)."""
    count = 0
    for path, state in states.items():
        if not row_gone(path, state.root):
            continue
        now = contents.get(state.sha256)
        moved = now is not None and now[0] == state.id and now[1] not in (None, path) and not file_gone(str(now[1]))
        count += not moved
    return count
