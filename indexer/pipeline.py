"""The bulk indexing pipeline: read → embed → commit, each stage overlapping the next.

reader threads (read bytes, sha256, probe the header) → batches of `batch_size` embedded by the
encoder, `inflight` batches at once → one writer committing each batch to the catalog (SQL rows +
vectors in one transaction, then FAISS). Incremental: a file whose size and mtime are unchanged
is not read; one whose bytes the collection has already is not embedded (a rename only moves its
path). Bad files are recorded and skipped. A stop request finishes the batches in flight, so a
re-run resumes without re-embedding anything that was committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indexer.catalog import FileState, SqlCatalog
from indexer.sources import SourceEntry, load_entries, looks_like_image
from indexer.types import NewImage, NewText
from retrieval.errors import InvalidImage, NotFound
from retrieval.preprocess import probe_image
from retrieval.types import Encoder

log = logging.getLogger(__name__)


@dataclass
class IndexSummary:
    """What a run did; `failures` are (path, reason) of the files it could not index."""

    total: int = 0
    added: int = 0
    changed: int = 0  # files whose bytes changed, re-embedded
    renamed: int = 0  # known bytes at a new path: path updated, nothing embedded
    unchanged: int = 0
    duplicates: int = 0  # same bytes as another file of the collection
    not_images: int = 0  # folder files that are not images at all (not reported as failures)
    pruned: int = 0
    would_index: int = 0  # --dry-run: files that would be read and (re-)embedded
    would_prune: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0
    embedded: int = 0  # images that went through the encoder (for items/s)

    @property
    def skipped(self) -> int:
        return self.unchanged + self.duplicates + self.not_images

    @property
    def done(self) -> int:
        return self.added + self.changed + self.renamed + self.skipped + len(self.failures)


@dataclass
class _Prepared:
    entry: SourceEntry
    data: bytes
    sha256: str
    mime: str
    width: int
    height: int
    size: int
    mtime: float
    replaces: int | None  # the row of this path's previous content


ProgressCallback = Callable[[IndexSummary], None]


class ImageIndexer:
    """Indexes a folder or manifest into one image collection of a catalog with any `Encoder`."""

    def __init__(
        self,
        catalog: SqlCatalog,
        encoder: Encoder,
        collection: str,
        *,
        batch_size: int = 32,
        read_threads: int = 2,
        inflight: int = 2,
        index_factory: str | None = None,
    ) -> None:
        self.catalog = catalog
        self.encoder = encoder
        self.collection = collection
        self.batch_size = batch_size
        self.read_threads = read_threads
        self.inflight = inflight
        self.index_factory = index_factory

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
        entries, problems = load_entries(source)
        summary = IndexSummary(total=len(entries) + len(problems), failures=list(problems))
        if dry_run:
            states = self._states_if_exists()
            todo = self._plan(entries, states, summary)
            summary.would_index = len(todo)
            summary.would_prune = sum(1 for path in states if prune and not os.path.exists(path))
            summary.seconds = time.perf_counter() - started
            return summary
        self.catalog.ensure_collection(
            self.collection, "images", self.encoder.model_id, self.encoder.dim, self.index_factory
        )
        todo = self._plan(entries, self.catalog.file_states(self.collection), summary)
        report(summary)
        await self._index(todo, summary, stop, report)
        if prune and not stop.is_set():
            summary.pruned = await asyncio.to_thread(self._prune)
        await asyncio.to_thread(self.catalog.flush)
        summary.interrupted = stop.is_set()
        summary.seconds = time.perf_counter() - started
        report(summary)
        return summary

    def _states_if_exists(self) -> dict[str, FileState]:
        try:
            return self.catalog.file_states(self.collection)
        except NotFound:
            return {}

    def _plan(
        self, entries: list[SourceEntry], states: dict[str, FileState], summary: IndexSummary
    ) -> list[tuple[SourceEntry, FileState | None]]:
        """Files that need reading: new ones and those whose size or mtime changed."""
        todo = []
        for entry in entries:
            state = states.get(str(entry.path))
            try:
                stat = entry.path.stat()
            except OSError as exc:
                summary.failures.append((str(entry.path), f"cannot read: {exc.strerror or exc}"))
                continue
            if state is not None and state.size == stat.st_size and state.mtime == stat.st_mtime:
                summary.unchanged += 1
            else:
                todo.append((entry, state))
        return todo

    def _prune(self) -> int:
        gone = [s.id for path, s in self.catalog.file_states(self.collection).items() if not os.path.exists(path)]
        return self.catalog.delete(gone) if gone else 0

    # --- stages ------------------------------------------------------------------------------
    async def _read(
        self, todo: list[tuple[SourceEntry, FileState | None]], summary: IndexSummary, stop: asyncio.Event
    ) -> AsyncIterator[_Prepared]:
        """Files read and probed by the reader threads, in order, a bounded window ahead."""
        window = max(self.batch_size * 2, self.read_threads * 4)
        with ThreadPoolExecutor(self.read_threads, thread_name_prefix="cnclip-read") as pool:
            pending: deque[Future[_Prepared | tuple[str, str] | None]] = deque()
            position = 0
            while position < len(todo) or pending:
                while position < len(todo) and len(pending) < window and not stop.is_set():
                    pending.append(pool.submit(_read_file, *todo[position]))
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

    async def _embed(self, batch: list[_Prepared], summary: IndexSummary) -> tuple[list[_Prepared], np.ndarray]:
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

    async def _index(
        self,
        todo: list[tuple[SourceEntry, FileState | None]],
        summary: IndexSummary,
        stop: asyncio.Event,
        report: ProgressCallback,
    ) -> None:
        contents = self.catalog.content_index(self.collection)
        queue: asyncio.Queue[tuple[str, object] | None] = asyncio.Queue(maxsize=self.inflight)

        embeddings: set[asyncio.Task[tuple[list[_Prepared], np.ndarray]]] = set()  # in flight, not yet committed

        def embed(batch: list[_Prepared]) -> asyncio.Task[tuple[list[_Prepared], np.ndarray]]:
            task = asyncio.create_task(self._embed(batch, summary))
            embeddings.add(task)
            return task

        async def produce() -> None:
            batch: list[_Prepared] = []
            pending_shas: set[str] = set()
            try:
                async for prepared in self._read(todo, summary, stop):
                    known = contents.get(prepared.sha256)
                    if known is None and prepared.sha256 not in pending_shas:
                        pending_shas.add(prepared.sha256)
                        batch.append(prepared)
                        if len(batch) >= self.batch_size:
                            await queue.put(("embed", embed(batch)))
                            batch = []
                        continue
                    await queue.put(("move", self._known_content(prepared, known, contents, summary)))
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

        async def commit() -> None:
            while (job := await queue.get()) is not None:
                kind, payload = job
                if kind == "move":
                    await asyncio.to_thread(self._apply_move, payload)  # type: ignore[arg-type]
                else:
                    good, vectors = await payload  # type: ignore[misc]
                    embeddings.discard(payload)  # type: ignore[arg-type]
                    await asyncio.to_thread(self._commit, good, vectors, summary)
                report(summary)

        producer = asyncio.create_task(produce())
        try:
            await commit()
        except BaseException:
            # A batch failed (e.g. the remote encoder is gone): stop reading and drop the batches in
            # flight. Everything committed so far stays; a rerun resumes from there.
            for task in (producer, *embeddings):
                task.cancel()
            await asyncio.gather(producer, *embeddings, return_exceptions=True)
            raise
        await producer

    def _known_content(
        self,
        prepared: _Prepared,
        known: tuple[int, str | None] | None,
        contents: dict[str, tuple[int, str | None]],
        summary: IndexSummary,
    ) -> tuple[list[tuple[int, str, int, float]], list[int]]:
        """Bytes the collection has already: a touched file, a rename, or a duplicate. Returns
        (path updates, ids to delete) for the writer."""
        path = str(prepared.entry.path)
        if known is None:  # same bytes as a file earlier in this run: it is being embedded now
            summary.duplicates += 1
            return [], [prepared.replaces] if prepared.replaces is not None else []
        item_id, known_path = known
        if known_path == path:
            summary.unchanged += 1  # touched, same bytes: remember the new mtime only
        elif known_path is None or not os.path.exists(known_path):
            summary.renamed += 1
            contents[prepared.sha256] = (item_id, path)
        else:
            summary.duplicates += 1
            return [], [prepared.replaces] if prepared.replaces is not None else []
        return [(item_id, path, prepared.size, prepared.mtime)], []

    def _apply_move(self, payload: tuple[list[tuple[int, str, int, float]], list[int]]) -> None:
        updates, deletes = payload
        if updates:
            self.catalog.update_files(self.collection, updates)
        if deletes:
            self.catalog.delete(deletes)

    def _commit(self, batch: list[_Prepared], vectors: np.ndarray, summary: IndexSummary) -> None:
        if not batch:
            return
        images = [
            NewImage(
                data=p.data,
                path=str(p.entry.path),
                caption=p.entry.caption,
                tags=list(p.entry.tags),
                extra=dict(p.entry.extra),
                mtime=p.mtime,
                mime=p.mime,
                width=p.width,
                height=p.height,
                sha256=p.sha256,
            )
            for p in batch
        ]
        replaces = [p.replaces for p in batch]
        self.catalog.add_images(self.collection, images, vectors, model=self.encoder.model_id, replace=replaces)
        summary.embedded += len(batch)
        summary.changed += sum(1 for r in replaces if r is not None)
        summary.added += sum(1 for r in replaces if r is None)


def _read_file(entry: SourceEntry, state: FileState | None) -> _Prepared | tuple[str, str] | None:
    """Read, hash and probe one file (reader thread). None: not an image; (path, reason): a bad file."""
    try:
        stat = entry.path.stat()
        data = entry.path.read_bytes()
    except OSError as exc:
        return str(entry.path), f"cannot read: {exc.strerror or exc}"
    try:
        mime, width, height = probe_image(data)
    except InvalidImage as exc:
        if entry.listed or looks_like_image(entry.path, data[:16]):
            return str(entry.path), exc.message
        return None
    sha = hashlib.sha256(data).hexdigest()
    replaces = state.id if state is not None and state.sha256 != sha else None
    return _Prepared(entry, data, sha, mime, width, height, len(data), stat.st_mtime, replaces)


async def index_texts(
    catalog: SqlCatalog,
    encoder: Encoder,
    collection: str,
    texts: list[NewText],
    *,
    batch_size: int = 64,
    index_factory: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[int, int]:
    """Embed and add texts (a text collection for image → text); returns (added, already there)."""
    catalog.ensure_collection(collection, "texts", encoder.model_id, encoder.dim, index_factory)
    known = set(catalog.content_index(collection))
    fresh = [t for t in texts if hashlib.sha256(t.text.encode("utf-8")).hexdigest() not in known]
    added = 0
    for start in range(0, len(fresh), batch_size):
        batch = fresh[start : start + batch_size]
        vectors = await encoder.embed_texts([t.text for t in batch])
        results = await asyncio.to_thread(catalog.add_texts, collection, batch, vectors, model=encoder.model_id)
        added += sum(r.created for r in results)
        if on_progress:
            on_progress(len(batch), added)
    await asyncio.to_thread(catalog.flush)
    return added, len(texts) - added
