"""The migration job: re-embed every item of a collection with a new model into its shadow generation
(indexer/storage/sql/generations.py), catch up the items added meanwhile, probe the new vectors, build the new
generation's store and swap, while searches keep using the active generation.

Resumable by construction: each round asks SQL which items the shadow still lacks, so a run killed at
any point loses at most the batch it was embedding. `throttle` caps the items embedded per second
(the encoder is shared with the searches of a server). An item whose file is gone or changed cannot be
embedded again: the run stops before the swap and says how many, unless `prune_missing` (then they are
pruned, as `cnclip index --prune` would).

The probe (`probe`) before a swap checks what a broken model or a broken fill would get wrong:
each sampled item embedded again now agrees with its stored shadow vector (cosine >= 0.99: the same
model made them all), finds itself among its `PROBE_K` nearest neighbours of the whole shadow (the
vectors are not degenerate), and a text query over an image collection gets hits with finite scores.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from indexer.domain.generations import Generation, MigrationStatus
from indexer.domain.records import CollectionState, ItemRecord
from indexer.errors import MediaChanged, MigrationRefused
from indexer.service.blocking import off_loop
from indexer.service.ports import GenerationStore, ItemLibrary
from retrieval.errors import CnclipError, NotFound
from retrieval.types import Encoder

log = logging.getLogger(__name__)

PROBE_K = 5
PROBE_AGREEMENT = 0.99
PROBE_TEXT = "一张照片"  # "a photo"
MigrationProgress = Callable[[int, int], None]  # (items the shadow covers, items of the collection)


@dataclass(frozen=True)
class MigrateOptions:
    batch: int = 32  # items per encoder call
    throttle: float = 0.0  # most items embedded per second; 0 = as fast as the encoder goes
    swap: bool = True  # swap once coverage is full and the probe passes
    prune_missing: bool = False  # prune items whose files are gone or changed instead of stopping
    probe_sample: int = 8
    max_rounds: int = 1000  # catch-up rounds (items keep arriving) before the run stops without swapping


@dataclass(frozen=True)
class ProbeResult:
    sampled: int
    found_self: int  # sampled items among their own PROBE_K nearest neighbours
    agreement: float  # lowest cosine between a stored shadow vector and the same item embedded now
    text_hits: int  # hits of PROBE_TEXT (image collections; -1: not asked)
    problem: str | None = None

    @property
    def passed(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class MigrateReport:
    status: MigrationStatus
    embedded: int
    pruned: int
    seconds: float
    swapped: bool
    prepared: bool  # the new generation's store was built before the swap
    probe: ProbeResult | None

    @property
    def items_per_s(self) -> float:
        return self.embedded / self.seconds if self.seconds > 0 else 0.0


class MigrationJob:
    """One run of `cnclip migrate` (or of a re-embedding job in a runtime's background)."""

    def __init__(
        self,
        library: ItemLibrary,
        generations: GenerationStore,
        delete: Callable[[list[int]], int],
        encoder: Encoder,
        name: str,
        options: MigrateOptions,
        on_progress: MigrationProgress | None = None,
    ) -> None:
        self.library, self.generations = library, generations
        self.delete, self.encoder, self.name = delete, encoder, name
        self.options, self.on_progress = options, on_progress
        self.embedded = self.pruned = 0

    async def run(self) -> MigrateReport:
        started = time.perf_counter()
        generation = await off_loop(self.generations.begin_shadow, self.name, self.encoder.model_id, self.encoder.dim)
        try:
            return await self._run(generation, started)
        except (Exception, asyncio.CancelledError):
            await self._forget_if_empty(generation)
            raise

    async def _forget_if_empty(self, generation: Generation) -> None:
        """A run that fails before the shadow holds a single vector removes it: left behind, an empty
        shadow would refuse every later migration to another model ("is migrating to … already")."""
        try:
            shadow = (await off_loop(self.generations.status, self.name)).shadow
            if shadow is not None and shadow.id == generation.id and shadow.vectors == 0:
                await off_loop(self.generations.drop, self.name, "shadow")
                log.info(
                    "migration of %s to %s failed before its first vector: its shadow is removed",
                    self.name,
                    self.encoder.model_id,
                )
        except CnclipError as exc:  # the failure that brought us here is what the caller hears about
            log.warning("could not remove the empty shadow of %s: %s", self.name, exc.message)

    async def _run(self, generation: Generation, started: float) -> MigrateReport:
        probe, prepared, swapped = None, False, False
        for _round in range(self.options.max_rounds):
            await self._fill(generation)
            if not self.options.swap or not await self._still_shadow(generation):
                break
            probe = await self.probe(generation)
            if not probe.passed:
                raise MigrationRefused(f"the probe of {self.encoder.model_id} failed, nothing swapped: {probe.problem}")
            prepared = await off_loop(self.generations.prepare, self.name, generation)
            try:
                await off_loop(self.generations.swap, self.name, "shadow")
                swapped = True
                break
            except MigrationRefused:  # items arrived between the fill and the swap: catch them up
                continue
        status = await off_loop(self.generations.status, self.name)
        seconds = time.perf_counter() - started
        return MigrateReport(status, self.embedded, self.pruned, seconds, swapped, prepared, probe)

    async def _still_shadow(self, generation: Generation) -> bool:
        """Whether `generation` is still the collection's shadow (another run may have swapped it in)."""
        shadow = (await off_loop(self.generations.status, self.name)).shadow
        return shadow is not None and shadow.id == generation.id

    async def _fill(self, generation: Generation) -> None:
        """Embed what the shadow lacks until it lacks nothing (or only unreadable items): passes over the
        ids in order (a cursor: each item is read once per pass), again from the start while a pass found
        something (items a concurrent writer committed behind the cursor)."""
        unreadable: set[int] = set()
        after, progressed = 0, False
        progress = _Progress(self, generation)
        while True:
            found = await off_loop(self.generations.shadow_missing, self.name, generation, self.options.batch, after)
            if not found:
                if after == 0 or not progressed:
                    break
                after, progressed = 0, False
                continue
            after = found[-1]
            ids = [i for i in found if i not in unreadable]
            if not ids:
                continue
            progressed = True
            batch_started = time.perf_counter()
            kept, vectors = await self._embed(ids, unreadable)
            if kept:
                try:
                    stored = await off_loop(self.generations.put_shadow, generation, kept, vectors)
                except MigrationRefused:
                    if await self._still_shadow(generation):
                        raise
                    return  # another run swapped it in (or dropped it): nothing left to fill
                self.embedded += stored
                await progress.add(stored)
            await self._throttle(len(ids), time.perf_counter() - batch_started)
        if unreadable:
            self._unreadable(sorted(unreadable))
            if self.options.prune_missing:
                self.pruned += await off_loop(self.delete, sorted(unreadable))

    def _unreadable(self, ids: list[int]) -> None:
        if not self.options.prune_missing:
            raise MigrationRefused(
                f"{len(ids)} items of {self.name!r} cannot be embedded again: their files are gone or changed "
                f"(first id {ids[0]}); re-index the folder (cnclip index --prune) or pass --prune-missing"
            )

    async def _throttle(self, count: int, took: float) -> None:
        if self.options.throttle > 0:
            await asyncio.sleep(max(0.0, count / self.options.throttle - took))

    async def _embed(self, ids: list[int], unreadable: set[int]) -> tuple[list[int], np.ndarray]:
        """The new model's vectors of the readable items among `ids` (the others join `unreadable`)."""
        records = await off_loop(self.library.get_many, ids)
        if records and records[0].kind == "texts":
            texts = [(r.id, r.caption or "") for r in records]
            return [i for i, _ in texts], await self.encoder.embed_texts([t for _, t in texts])
        images = await off_loop(_read_all, self.library, records)
        unreadable.update(r.id for r in records if r.id not in images)
        kept = [r.id for r in records if r.id in images]
        if not kept:
            return [], np.zeros((0, self.encoder.dim), dtype=np.float32)
        return kept, await self.encoder.embed_images([images[i] for i in kept])

    async def probe(self, generation: Generation) -> ProbeResult:
        """The sanity probe before a swap (see the module docstring)."""
        assert generation.id is not None
        covered = await off_loop(self.generations.covered_ids, generation)
        if len(covered) == 0:
            return ProbeResult(0, 0, 1.0, -1)
        picks = covered[np.linspace(0, len(covered) - 1, min(self.options.probe_sample, len(covered))).astype(int)]
        stored = await off_loop(self.generations.vectors_of, generation, [int(i) for i in picks])
        kept, fresh = await self._embed([int(i) for i in picks], set())
        rows = {int(i): n for n, i in enumerate(picks)}
        agreement = min((float(stored[rows[i]] @ v) for i, v in zip(kept, fresh, strict=True)), default=1.0)
        near = await off_loop(_nearest, self.generations, generation, covered, stored)
        found = sum(int(picks[n]) in near[n] for n in range(len(picks)))
        text_hits = -1
        state: CollectionState = await off_loop(self.library.collection, self.name)
        if state.kind == "images":
            query = (await self.encoder.embed_texts([PROBE_TEXT]))[0]
            scores = (await off_loop(_nearest, self.generations, generation, covered, query[None, :], True))[0]
            text_hits = len(scores)
        problem = None
        if agreement < PROBE_AGREEMENT:
            problem = (
                f"an item embedded now differs from its stored vector (cosine {agreement:.3f} < {PROBE_AGREEMENT})"
            )
        elif found < len(picks):
            problem = f"only {found} of {len(picks)} sampled items are among their own {PROBE_K} nearest neighbours"
        elif text_hits == 0:
            problem = "a text query found nothing"
        return ProbeResult(len(picks), found, agreement, text_hits, problem)


class _Progress:
    """(covered, items) for the progress callback: counted here, read again from SQL every
    `REFRESH_EVERY` batches (other runs and writers move both)."""

    REFRESH_EVERY = 50

    def __init__(self, job: MigrationJob, generation: Generation) -> None:
        self.job, self.generation = job, generation
        self.covered = self.items = -1
        self.batches = 0

    async def add(self, stored: int) -> None:
        if self.job.on_progress is None:
            return
        if self.batches % self.REFRESH_EVERY == 0:
            status = await off_loop(self.job.generations.status, self.job.name)
            self.covered = status.shadow.vectors if status.shadow is not None else 0
            self.items = status.items
        else:
            self.covered = min(self.items, self.covered + stored)
        self.batches += 1
        self.job.on_progress(self.covered, self.items)


def _read_all(library: ItemLibrary, records: list[ItemRecord]) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    for record in records:
        try:
            found[record.id] = library.read_media(record)
        except (NotFound, MediaChanged, OSError):
            continue
    return found


def _nearest(
    generations: GenerationStore,
    generation: Generation,
    covered: np.ndarray,
    queries: np.ndarray,
    scores: bool = False,
) -> list[list[int]]:
    """Exact top-PROBE_K ids (or, with `scores`, their finite scores) of each query among the shadow's vectors."""
    best = [np.full(0, -np.inf)] * len(queries)
    best_ids = [np.zeros(0, dtype=np.int64)] * len(queries)
    for start in range(0, len(covered), 20_000):
        part = covered[start : start + 20_000]
        matrix = generations.vectors_of(generation, [int(i) for i in part])
        sims = queries @ matrix.T
        for n in range(len(queries)):
            merged = np.concatenate([best[n], sims[n]])
            merged_ids = np.concatenate([best_ids[n], part])
            top = np.argsort(-merged, kind="stable")[:PROBE_K]
            best[n], best_ids[n] = merged[top], merged_ids[top]
    if scores:
        return [[float(s) for s in b if np.isfinite(s)] for b in best]  # type: ignore[misc]
    return [[int(i) for i in ids] for ids in best_ids]
