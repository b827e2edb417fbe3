"""The bulk indexing pipeline: read → embed → commit, each stage overlapping the next.

reader threads (read bytes, sha256, read the header once) → batches of `batch_size` embedded by the
encoder, `inflight` batches at once → one writer committing each batch through the collection
service (SQL rows + vectors in one transaction; the vector store is caught up once, at the end).
Incremental: a file whose size and mtime are unchanged (and whose st_ctime is older than its row) is
not read; one whose bytes the collection has already is not embedded (a rename only moves its path:
moves by content first, indexer/bulk/moves.py, then indexer/bulk/routing.py). Bad files (one over the image limit
is never read whole) are recorded and skipped. A stop request finishes the batches in flight, so a
re-run resumes without re-embedding anything that was committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from indexer.bulk.backfills import backfill
from indexer.bulk.moves import FileMoves, prunable, settle_moves, unchanged
from indexer.bulk.raw_companions import raw_companions
from indexer.bulk.reading import PreparedFile, read_file, read_phash, read_taken
from indexer.bulk.routing import FileRouter, MovePayload
from indexer.bulk.sources import SourceEntry, identities, load_entries
from indexer.domain.index_summary import IndexSummary, ProgressCallback
from indexer.domain.records import CollectionState, FileState, NewImage
from indexer.fs.presence import gone_error, row_gone
from indexer.service.collections import CollectionService
from indexer.storage.sql.duplicate_rows import FileCopy
from retrieval.errors import InvalidImage, NotFound
from retrieval.preprocess import preprocess_image
from retrieval.types import Encoder

__all__ = ["ImageIndexer", "IndexSummary", "ProgressCallback"]

log = logging.getLogger(__name__)

Todo = list[tuple[SourceEntry, FileState | None]]
Embedding = asyncio.Task[tuple[list[PreparedFile], np.ndarray]]


class ImageIndexer:
    """Indexes a folder or manifest into one image collection through the collection service
    (which checks the collection's kind and model) with the encoder of the collection's active model
    (a server may hold several, CNCLIP_MODEL_DIRS); its vectors are tagged with that generation, so a
    model swap during the run refuses them (`GenerationMoved`) instead of mixing two models."""

    flush_at_end = True  # save the vector store when a run ends

    def __init__(
        self,
        service: CollectionService,
        collection: str,
        *,
        batch_size: int = 32,
        read_threads: int = 2,
        inflight: int = 2,
        index_factory: str | None = None,
        restore_deleted: bool = False,
        exclude: Iterable[Path] = (),
    ) -> None:
        self.service = service
        self.exclude = tuple(exclude)  # folders never walked: the data dir (the product's own files)
        self.collection = collection
        self.batch_size = batch_size
        self.read_threads = read_threads
        self.inflight = inflight
        self.index_factory = index_factory
        self.restore_deleted = restore_deleted
        self.undated: list[SourceEntry] = []  # unchanged files whose rows have no taken_at (from _plan)
        self.unhashed: list[SourceEntry] = []  # unchanged files whose rows have no perceptual hash
        self.copies: list[FileCopy] = []  # files with the bytes of an item at another path (recorded at the end)
        self._target: CollectionState | None = None  # the collection as this run found it (`ensure`)

    @property
    def encoder(self) -> Encoder:
        assert self._target is not None, "the collection is resolved when the run starts"
        return self.service.encoder_for(self._target)  # EncoderUnavailable in a process with no model

    async def run(
        self,
        source: Path,
        *,
        prune: bool = False,
        dry_run: bool = False,
        stop: asyncio.Event | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> IndexSummary:
        started = time.perf_counter()
        stop = stop or asyncio.Event()
        report = on_progress or (lambda _summary: None)
        entries, problems = load_entries(source, skip=identities(self.exclude))
        summary = IndexSummary(total=len(entries) + len(problems), failures=list(problems))
        if dry_run:
            await self._dry_run(entries, summary, stop, report, prune)
        else:
            await self._real_run(entries, summary, stop, report, prune)
        summary.interrupted = stop.is_set()
        summary.seconds = time.perf_counter() - started
        report(summary)
        return summary

    async def _real_run(
        self,
        entries: list[SourceEntry],
        summary: IndexSummary,
        stop: asyncio.Event,
        report: ProgressCallback,
        prune: bool,
    ) -> None:
        self._target = self.service.ensure(self.collection, "images", self.index_factory)
        if self.restore_deleted:
            restored = self.service.forget_deletions(self.collection)
            log.info("%s: %d deleted items may be indexed again", self.collection, restored)
        todo = self._plan(entries, self.service.file_states(self.collection), summary)
        moves = (self.service, self.collection, todo, summary, self.read_threads, None, stop.is_set, self._apply_moves)
        todo = await asyncio.to_thread(settle_moves, *moves, self._folder_moving)  # by content, before routing
        report(summary)
        if self.undated and not stop.is_set():
            summary.dated = await asyncio.to_thread(self._date_unchanged, self.service.file_states(self.collection))
        if self.unhashed and not stop.is_set():
            summary.hashed = await asyncio.to_thread(self._hash_unchanged, self.service.file_states(self.collection))
        await self._index(todo, summary, stop, report)
        if self.copies:
            await asyncio.to_thread(self.service.record_copies, self.collection, self.copies)
        if prune and not stop.is_set():
            summary.pruned = await asyncio.to_thread(self._prune)
        if self.flush_at_end:  # a folder watcher's passes leave it to the store's own saves (indexer/watch/watcher.py)
            await asyncio.to_thread(self.service.flush, self.collection)

    def _plan(self, entries: list[SourceEntry], states: dict[str, FileState], summary: IndexSummary) -> Todo:
        """Files that need reading: new ones and those whose size or mtime changed. A RAW beside a
        rendered image of the same shot is counted, not read (indexer/bulk/raw_companions.py)."""
        todo = []
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
                    self.undated.append(entry)
                if not state.has_phash:
                    self.unhashed.append(entry)
            else:
                todo.append((entry, state))
        return todo

    def _date_unchanged(self, states: dict[str, FileState]) -> int:
        """The date backfill (indexer/bulk/backfills.py) for rows indexed before taken_at existed."""
        read = functools.partial(read_taken, max_bytes=self.service.max_image_bytes)
        store = functools.partial(self.service.set_taken, self.collection)
        return backfill(self.undated, states, read, store, self.read_threads, "date")

    def _hash_unchanged(self, states: dict[str, FileState]) -> int:
        """The perceptual-hash backfill, for rows indexed before perceptual hashes existed."""
        read = functools.partial(read_phash, max_bytes=self.service.max_image_bytes)
        store = functools.partial(self.service.set_phashes, self.collection)
        return backfill(self.unhashed, states, read, store, self.read_threads, "phash")

    def _prune(self) -> int:
        states = self.service.file_states(self.collection)
        gone = [state.id for path, state in states.items() if row_gone(path, state.root)]  # indexer/fs/presence.py
        copies = self.service.prune_copies(self.collection)
        if copies:
            log.info("%s: forgot %d copies whose files are gone", self.collection, copies)
        return self.service.delete_items(gone, reason="pruned") if gone else 0

    # --- the dry run ---------------------------------------------------------------------------
    async def _dry_run(
        self,
        entries: list[SourceEntry],
        summary: IndexSummary,
        stop: asyncio.Event,
        report: ProgressCallback,
        prune: bool,
    ) -> None:
        """Reads, decodes and hashes what a real run would (without the model), so that `would_index`
        is exactly what it would embed and every file it would fail fails here."""
        try:
            states = self.service.file_states(self.collection)
            router = FileRouter(
                self.service.content_index(self.collection), self.service.remembered_deletions(self.collection)
            )
        except NotFound:  # a collection a real run would create
            states, router = {}, FileRouter({}, set())
        todo = self._plan(entries, states, summary)
        moves = (self.service, self.collection, todo, summary, self.read_threads, router.contents, stop.is_set)
        todo = await asyncio.to_thread(settle_moves, *moves)
        summary.would_date = len(self.undated)
        report(summary)
        # What the encoder runs on every image it embeds (retrieval/encoder.py), with the same limits:
        # an image it would refuse is counted as failing, not as one to embed (and not again after
        # every run). Decoded by the reader threads; only the files routed to the encoder count.
        decode = functools.partial(
            preprocess_image, max_bytes=self.service.max_image_bytes, max_pixels=self.service.max_image_pixels
        )
        async for prepared in self._read(todo, summary, stop, decode):
            if router.route(prepared, summary) == "embed":
                if prepared.decode_error is None:
                    summary.would_index += 1
                else:
                    summary.failures.append((str(prepared.entry.path), prepared.decode_error))
            report(summary)
        summary.would_prune = prunable(states, router.contents) if prune else 0  # after the moves and renames

    # --- stages ------------------------------------------------------------------------------
    async def _read(
        self,
        todo: Todo,
        summary: IndexSummary,
        stop: asyncio.Event,
        decode: Callable[[bytes], object] | None = None,
        needs_hash: Callable[[str], bool] | None = None,
    ) -> AsyncIterator[PreparedFile]:
        """Files read and probed (and with `decode`, decoded; with `needs_hash`, perceptually hashed)
        by the reader threads, in order, a bounded window ahead."""
        window = max(self.batch_size * 2, self.read_threads * 4)
        limit = self.service.max_image_bytes  # a larger file is refused before it is read
        with ThreadPoolExecutor(self.read_threads, thread_name_prefix="cnclip-read") as pool:
            pending: deque[Future[PreparedFile | tuple[str, str] | None]] = deque()
            position = 0
            while position < len(todo) or pending:
                while position < len(todo) and len(pending) < window and not stop.is_set():
                    pending.append(pool.submit(read_file, *todo[position], decode, needs_hash, limit))
                    position += 1
                if not pending:
                    break
                result = await asyncio.wrap_future(pending.popleft())
                if stop.is_set():
                    for future in pending:
                        future.cancel()
                    return
                if result is None:
                    summary.not_images += 1
                elif isinstance(result, tuple):
                    summary.failures.append(result)
                else:
                    yield result

    async def _embed(self, batch: list[PreparedFile], summary: IndexSummary) -> tuple[list[PreparedFile], np.ndarray]:
        """Vectors for a batch; when the encoder refuses one image, the others are embedded alone."""
        try:
            return batch, await self.encoder.embed_images([p.data for p in batch])
        except InvalidImage:
            good, vectors = [], []
            for prepared in batch:
                try:
                    vectors.append((await self.encoder.embed_images([prepared.data]))[0])
                    good.append(prepared)
                except InvalidImage as exc:
                    summary.failures.append((str(prepared.entry.path), exc.message))
            return good, np.array(vectors, dtype=np.float32).reshape(len(good), self.encoder.dim)

    async def _index(self, todo: Todo, summary: IndexSummary, stop: asyncio.Event, report: ProgressCallback) -> None:
        """Reader → encoder → writer: a producer routes the read files into embedding batches and
        moves, the writer commits them in order. A failed batch stops everything; what was committed
        stays (a rerun resumes from there)."""
        router = FileRouter(
            self.service.content_index(self.collection),
            self.service.remembered_deletions(self.collection),
            self.copies,
        )
        queue: asyncio.Queue[tuple[str, object] | None] = asyncio.Queue(maxsize=self.inflight)
        embeddings: set[Embedding] = set()  # in flight, not yet committed
        producer = asyncio.create_task(self._produce(todo, router, queue, embeddings, summary, stop))
        try:
            while (job := await queue.get()) is not None:
                await self._write(job, embeddings, summary)
                report(summary)
        except BaseException:
            # A batch failed (e.g. the remote encoder is gone): stop reading and drop the batches in
            # flight. Everything committed so far stays; a rerun resumes from there.
            for task in (producer, *embeddings):
                task.cancel()
            await asyncio.gather(producer, *embeddings, return_exceptions=True)
            raise
        await producer

    async def _produce(
        self,
        todo: Todo,
        router: FileRouter,
        queue: asyncio.Queue[tuple[str, object] | None],
        embeddings: set[Embedding],
        summary: IndexSummary,
        stop: asyncio.Event,
    ) -> None:
        def embed(batch: list[PreparedFile]) -> Embedding:
            task = asyncio.create_task(self._embed(batch, summary))
            embeddings.add(task)
            return task

        batch: list[PreparedFile] = []
        try:
            async for prepared in self._read(todo, summary, stop, needs_hash=router.needs_hash):
                action = router.route(prepared, summary)
                if action == "embed":
                    batch.append(prepared)
                    if len(batch) >= self.batch_size:
                        await queue.put(("embed", embed(batch)))
                        batch = []
                elif action is not None:
                    await queue.put(("move", action))
            if batch and not stop.is_set():
                await queue.put(("embed", embed(batch)))
        except asyncio.CancelledError:
            # The writer failed and cancelled this task: it reads no more, so never wait for room.
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
            raise
        except BaseException:
            await queue.put(None)  # the writer still runs: it commits what is queued, then stops
            raise
        await queue.put(None)

    async def _write(self, job: tuple[str, object], embeddings: set[Embedding], summary: IndexSummary) -> None:
        kind, payload = job
        if kind == "move":
            await asyncio.to_thread(self._apply_move, payload)  # type: ignore[arg-type]
            return
        task: Embedding = payload  # type: ignore[assignment]
        good, vectors = await task
        embeddings.discard(task)
        await asyncio.to_thread(self._commit, good, vectors, summary)

    def _apply_moves(self, moves: FileMoves) -> None:
        """A pass's moves by content, in one transaction (indexer/bulk/moves.py)."""
        self.service.move_files(self.collection, moves)

    def _folder_moving(self) -> bool:
        """Whether the folder changed while this run read it (a watcher knows: its hints); then no
        item found nowhere is replaced by the run's moves (indexer/bulk/moves.py)."""
        return False

    def _apply_move(self, payload: MovePayload) -> None:
        updates, dates, deletes = payload
        if deletes:  # first: never two rows at one path, even if the process dies in between
            self.service.delete_items(deletes, reason="replaced")
        if updates:
            self.service.update_files(self.collection, updates)
        if dates:
            self.service.set_taken(self.collection, dates)

    def _commit(self, batch: list[PreparedFile], vectors: np.ndarray, summary: IndexSummary) -> None:
        if not batch:
            return
        images = [
            NewImage(
                data=p.data,
                path=str(p.entry.path),
                root=str(p.entry.root) if p.entry.root is not None else None,
                caption=p.entry.caption,
                tags=list(p.entry.tags),
                extra=dict(p.entry.extra),
                mtime=p.mtime,
                mime=p.mime,
                width=p.width,
                height=p.height,
                sha256=p.sha256,
                taken_at=p.taken[0],
                taken_source=p.taken[1],
                phash=p.phash,
            )
            for p in batch
        ]
        replaces = [p.replaces for p in batch]
        key = self._target.vector_key if self._target is not None else None
        results = self.service.add_images(self.collection, images, vectors, replace=replaces, vector_key=key)
        summary.embedded += len(batch)
        # Another indexer may have committed the same bytes meanwhile: then it is a duplicate here;
        # a user may have deleted them meanwhile: then they stay deleted.
        summary.deleted_before += sum(1 for r in results if r.deleted_by_user)
        summary.duplicates += sum(1 for r in results if not r.created and not r.deleted_by_user)
        summary.changed += sum(1 for r, old in zip(results, replaces, strict=True) if r.created and old is not None)
        summary.added += sum(1 for r, old in zip(results, replaces, strict=True) if r.created and old is None)
