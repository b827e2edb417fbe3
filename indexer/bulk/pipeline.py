"""The bulk indexing pipeline: read → embed → commit, each stage overlapping the next.

reader threads (read bytes, sha256, read the header once; with the local encoder, decode new files
into its pixels: indexer/bulk/embedding.py) → batches of `batch_size` embedded by the encoder,
`inflight` batches at once → one writer committing each batch through the collection service (SQL
rows + vectors in one transaction; the vector store is caught up once, at the end). Each stage's
time goes into the summary's `stages` (indexer/bulk/stage_clock.py).
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
from typing import Any

import numpy as np

from indexer.bulk.backfills import backfill
from indexer.bulk.embedding import Decode, embed_batch, pixel_decoder
from indexer.bulk.index_run import IndexRun, Todo, plan
from indexer.bulk.moves import FileMoves, prunable, settle_moves
from indexer.bulk.ocr_stage import OcrStage
from indexer.bulk.reading import PreparedFile, pixels_and_hash, read_file, read_phash, read_taken
from indexer.bulk.routing import FileRouter, MovePayload
from indexer.bulk.sources import SourceEntry, identities, load_entries
from indexer.bulk.stage_clock import StageClock
from indexer.config import StorageSettings
from indexer.domain.index_summary import IndexSummary, ProgressCallback
from indexer.domain.records import AddResult, CollectionState, FileState
from indexer.fs.presence import row_gone
from indexer.service.collections import CollectionService
from retrieval.errors import EncoderUnavailable, InvalidInput, NotFound
from retrieval.preprocess import ImagePreprocessor
from retrieval.types import Encoder

__all__ = ["ImageIndexer", "IndexRun", "IndexSummary", "ProgressCallback", "Todo"]

log = logging.getLogger(__name__)

Embedding = asyncio.Task[tuple[list[PreparedFile], np.ndarray]]


class ImageIndexer:
    """Indexes a folder or manifest into one image collection through the collection service
    (which checks the collection's kind and model) with the encoder of the collection's active model
    (a server may hold several, CNCLIP_MODEL_DIRS); its vectors are tagged with that generation, so a
    model swap during the run refuses them (`GenerationMoved`) instead of mixing two models. What a run
    learns lives in its `IndexRun` (indexer/bulk/index_run.py), made per run."""

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
        self.ocr = OcrStage(service)  # collections with OCR: text read beside the embedding (docs/ocr.md)

    @classmethod
    def from_settings(
        cls, settings: StorageSettings, service: CollectionService, collection: str, **options: Any
    ) -> ImageIndexer:
        """The pipeline with the settings' batch size and reader threads, and `inflight` batches: one
        per encoder stream plus one being filled, at least two (the one rule of every caller)."""
        options.setdefault("batch_size", settings.index_batch_size)
        options.setdefault("read_threads", settings.index_read_threads)
        return cls(service, collection, inflight=max(2, settings.streams + 1), **options)

    def encoder(self, run: IndexRun) -> Encoder:
        """The encoder of the run's collection (`EncoderUnavailable` in a process with no model)."""
        return self.service.migration.encoder_for(run.target)

    def new_run(
        self,
        summary: IndexSummary,
        stop: asyncio.Event,
        report: ProgressCallback,
        *,
        target: CollectionState | None = None,
        **hooks: Any,
    ) -> IndexRun:
        """A run into the collection: `target` as the caller resolved it, else ensured here (created
        when missing); `hooks`: the rest of `IndexRun` (a watcher's prune and checks)."""
        target = target or self.service.ensure(self.collection, "images", self.index_factory)
        return IndexRun(target, summary, stop, report, **hooks)

    async def run(
        self,
        source: Path,
        *,
        prune: bool = False,
        dry_run: bool = False,
        stop: asyncio.Event | None = None,
        on_progress: ProgressCallback | None = None,
        target: CollectionState | None = None,
    ) -> IndexSummary:
        """Index `source` (a folder or manifest). `target`: the collection as the caller resolved it
        (`cnclip index` does, before the model loads), so that it is not read again."""
        started = time.perf_counter()
        stop = stop or asyncio.Event()
        report = on_progress or (lambda _summary: None)
        entries, problems = load_entries(source, skip=identities(self.exclude))
        summary = IndexSummary(total=len(entries) + len(problems), failures=list(problems))
        summary.stages.walk_s = time.perf_counter() - started
        if dry_run:
            await self._dry_run(entries, summary, stop, report, prune)
        else:
            pruning = {"prune": self.prune_gone} if prune else {}
            run = self.new_run(summary, stop, report, target=target, restore_deleted=self.restore_deleted, **pruning)
            await self.index(entries, run)
        summary.interrupted = stop.is_set()
        summary.seconds = summary.stages.wall_s = time.perf_counter() - started
        report(summary)
        return summary

    async def index(self, entries: list[SourceEntry], run: IndexRun) -> None:
        """One run over `entries`: plan, moves by content, backfills, read → embed → commit, then the
        copies found, the run's prune and the flush. The file states are read once for the plan and
        the backfills (their rows are unchanged files: no move of the run touches them)."""
        if run.restore_deleted:
            restored = self.service.forget_deletions(self.collection)
            log.info("%s: %d deleted items may be indexed again", self.collection, restored)
        with run.clock.timing("walk"):
            states = self.service.file_states(self.collection)
            todo, run.undated, run.unhashed = plan(entries, states, run.summary)
        moves = (self.service, self.collection, todo, run.summary, self.read_threads, None, run.stop.is_set)
        apply_moves = functools.partial(self._apply_moves, run)
        todo = await asyncio.to_thread(settle_moves, *moves, apply_moves, run.folder_moving)  # by content, first
        run.report(run.summary)
        if run.undated and not run.stop.is_set():
            run.summary.dated = await asyncio.to_thread(self._date_unchanged, run.undated, states)
        if run.unhashed and not run.stop.is_set():
            run.summary.hashed = await asyncio.to_thread(self._hash_unchanged, run.unhashed, states)
        await self._index(run, todo)
        run.summary.read_for_text += await self.ocr.fill_missing(run.target, run.stop, run.clock)  # items without text
        if run.copies:
            await asyncio.to_thread(self.service.duplicates.record_copies, self.collection, run.copies)
        if run.prune is not None and not run.stop.is_set():
            run.summary.pruned = await asyncio.to_thread(run.prune, run)
        if run.flush:
            with run.clock.timing("vectors"):  # the store caught up from SQL and saved
                await asyncio.to_thread(self.service.flush, self.collection)

    def _date_unchanged(self, undated: list[SourceEntry], states: dict[str, FileState]) -> int:
        """The date backfill (indexer/bulk/backfills.py) for rows indexed before taken_at existed."""
        read = functools.partial(read_taken, max_bytes=self.service.max_image_bytes)
        store = functools.partial(self.service.set_taken, self.collection)
        return backfill(undated, states, read, store, self.read_threads, "date")

    def _hash_unchanged(self, unhashed: list[SourceEntry], states: dict[str, FileState]) -> int:
        """The perceptual-hash backfill, for rows without a hash of this `PHASH_VERSION` (indexer/domain/perceptual.py)."""
        read = functools.partial(read_phash, max_bytes=self.service.max_image_bytes)
        store = functools.partial(self.service.duplicates.set_phashes, self.collection)
        return backfill(unhashed, states, read, store, self.read_threads, "phash")

    def prune_gone(self, _run: IndexRun) -> int:
        """`--prune`: the rows whose files are gone, read after the run's moves and replacements."""
        states = self.service.file_states(self.collection)
        gone = [state.id for path, state in states.items() if row_gone(path, state.root)]  # indexer/fs/presence.py
        copies = self.service.duplicates.prune_copies(self.collection)
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
        todo, undated, _ = plan(entries, states, summary)
        moves = (self.service, self.collection, todo, summary, self.read_threads, router.contents, stop.is_set)
        todo = await asyncio.to_thread(settle_moves, *moves)
        summary.would_date = len(undated)
        report(summary)
        # What the encoder runs on every image it embeds (retrieval/encoder.py), with the same limits:
        # an image it would refuse is counted as failing, not as one to embed (and not again after
        # every run). Decoded by the reader threads; only the files routed to the encoder count.
        limits = ImagePreprocessor(max_bytes=self.service.max_image_bytes, max_pixels=self.service.max_image_pixels)
        decode = functools.partial(pixels_and_hash, limits, hashed=False)
        async for prepared in self._read(todo, summary, stop, StageClock(summary.stages), decode):
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
        clock: StageClock,
        decode: Decode | None = None,
        needs_hash: Callable[[str], bool] | None = None,
    ) -> AsyncIterator[PreparedFile]:
        """Files read and probed (and with `decode`, decoded; with `needs_hash`, perceptually hashed)
        by the reader threads, in order, a bounded window ahead (`read_s`: their time less `decode_s`)."""
        window = max(self.batch_size * 2, self.read_threads * 4)
        limit = self.service.max_image_bytes  # a larger file is refused before it is read
        with ThreadPoolExecutor(self.read_threads, thread_name_prefix="cnclip-read") as pool:
            pending: deque[Future[PreparedFile | tuple[str, str] | None]] = deque()
            position = 0
            while position < len(todo) or pending:
                while position < len(todo) and len(pending) < window and not stop.is_set():
                    read = functools.partial(read_file, *todo[position], decode, needs_hash, limit)
                    pending.append(pool.submit(clock.run, "read", read))
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

    async def _index(self, run: IndexRun, todo: Todo) -> None:
        """Reader → encoder → writer: a producer routes the read files into embedding batches and
        moves, the writer commits them in order. A failed batch stops everything; what was committed
        stays (a rerun resumes from there)."""
        router = FileRouter(
            self.service.content_index(self.collection),
            self.service.remembered_deletions(self.collection),
            run.copies,
        )
        queue: asyncio.Queue[tuple[str, object] | None] = asyncio.Queue(maxsize=self.inflight)
        embeddings: set[Embedding] = set()  # in flight, not yet committed
        producer = asyncio.create_task(self._produce(run, todo, router, queue, embeddings))
        try:
            while (job := await queue.get()) is not None:
                await self._write(run, job, embeddings)
                run.report(run.summary)
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
        run: IndexRun,
        todo: Todo,
        router: FileRouter,
        queue: asyncio.Queue[tuple[str, object] | None],
        embeddings: set[Embedding],
    ) -> None:
        summary, stop = run.summary, run.stop

        decode = None
        with contextlib.suppress(EncoderUnavailable, InvalidInput):  # else raised by the first batch to embed
            decode = pixel_decoder(self.encoder(run), run.clock)

        def embed(batch: list[PreparedFile]) -> Embedding:
            embedding = embed_batch(functools.partial(self.encoder, run), batch, decode, run.clock, summary.failures)
            task = asyncio.create_task(self.ocr.beside(embedding, run.target, batch, run.clock))
            embeddings.add(task)
            return task

        batch: list[PreparedFile] = []
        try:
            async for prepared in self._read(todo, summary, stop, run.clock, decode, router.needs_hash):
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

    async def _write(self, run: IndexRun, job: tuple[str, object], embeddings: set[Embedding]) -> None:
        kind, payload = job
        if kind == "move":
            move = functools.partial(self._apply_move, run, payload)  # type: ignore[arg-type]
            await asyncio.to_thread(run.clock.run, "commit", move)
            return
        task: Embedding = payload  # type: ignore[assignment]
        good, vectors = await task
        embeddings.discard(task)
        await asyncio.to_thread(run.clock.run, "commit", functools.partial(self._commit, run, good, vectors))

    def _apply_moves(self, run: IndexRun, moves: FileMoves) -> None:
        """A run's moves by content, in one transaction (indexer/bulk/moves.py)."""
        run.before_write()
        self.service.moves.move_files(self.collection, moves)

    def _apply_move(self, run: IndexRun, payload: MovePayload) -> None:
        run.before_write()
        updates, dates, deletes = payload
        if deletes:  # first: never two rows at one path, even if the process dies in between
            self.service.delete_items(deletes, reason="replaced")
        if updates:
            self.service.update_files(self.collection, updates)
        if dates:
            self.service.set_taken(self.collection, dates)

    def _commit(self, run: IndexRun, batch: list[PreparedFile], vectors: np.ndarray) -> None:
        run.before_write()
        if not batch:
            return
        images = [prepared.new_image() for prepared in batch]
        replaces = [p.replaces for p in batch]
        key = run.target.vector_key
        results = self.service.writes.add_images(self.collection, images, vectors, replace=replaces, vector_key=key)
        run.summary.read_for_text += self.ocr.store(run.target, batch, results)
        self._count_committed(run.summary, replaces, results)

    @staticmethod
    def _count_committed(summary: IndexSummary, replaces: list[int | None], results: list[AddResult]) -> None:
        """What one commit of embedded files did: added, changed, or bytes another run or a user got to first."""
        summary.embedded += len(results)
        # Another indexer may have committed the same bytes meanwhile: then it is a duplicate here;
        # a user may have deleted them meanwhile: then they stay deleted.
        summary.deleted_before += sum(1 for r in results if r.deleted_by_user)
        summary.duplicates += sum(1 for r in results if not r.created and not r.deleted_by_user)
        summary.changed += sum(1 for r, old in zip(results, replaces, strict=True) if r.created and old is not None)
        summary.added += sum(1 for r, old in zip(results, replaces, strict=True) if r.created and old is None)
