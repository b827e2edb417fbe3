"""The OCR stage of the bulk pipeline (indexer/bulk/pipeline.py), for collections with OCR (docs/ocr.md).

Each embedding batch is read for text at the same time as it is embedded: the reader has its own
bounded threads (CNCLIP_OCR_THREADS, retrieval/ocr/reader.py), so OCR overlaps the encoder's streams
and the reader threads instead of following them. The writer waits for a batch's text before it
commits the batch, and stores the text once the items exist (their ids), so the batches in flight
bound the memory of both. At the end of a run the items still without text (indexed before OCR was on,
or while the engine was unavailable) are read too, without embedding anything: `cnclip index --ocr` on
an indexed folder reads its photos, like `cnclip ocr`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence

import numpy as np

from indexer.bulk.reading import PreparedFile
from indexer.bulk.stage_clock import StageClock
from indexer.domain.records import AddResult, CollectionState
from indexer.service.collections import CollectionService
from retrieval.errors import EncoderUnavailable
from retrieval.ocr.types import RecognisedText

log = logging.getLogger(__name__)

Embedded = tuple[list[PreparedFile], np.ndarray]  # the files a batch kept and their vectors


class OcrStage:
    """Text for the pipeline's batches, by the service's recognition use cases."""

    def __init__(self, service: CollectionService) -> None:
        self.service = service
        self._texts: dict[int, RecognisedText] = {}  # by id() of an embedded PreparedFile, until committed

    async def beside(
        self,
        embedding: Awaitable[Embedded],
        target: CollectionState | None,
        batch: list[PreparedFile],
        clock: StageClock | None = None,
    ) -> Embedded:
        """`embedding` (the batch's vectors), with the batch read for text at the same time when the
        collection has OCR (timed as `ocr` on `clock`); the text of the files it kept waits for `store`."""
        if target is None or not self.service.texts.wanted(target):
            return await embedding
        (kept, vectors), texts = await asyncio.gather(embedding, self._read(target, batch, clock or StageClock()))
        if texts is not None:
            wanted = {id(p) for p in kept}
            self._texts.update({id(p): t for p, t in zip(batch, texts, strict=True) if id(p) in wanted})
        return kept, vectors

    async def _read(
        self, target: CollectionState, batch: list[PreparedFile], clock: StageClock
    ) -> list[RecognisedText] | None:
        with clock.sharing("ocr"):
            return await self.service.texts.read(target, [p.data for p in batch])

    def store(self, target: CollectionState | None, batch: Sequence[PreparedFile], added: Sequence[AddResult]) -> int:
        """Store the text read for the committed `batch` (blocking); returns how many items got a row."""
        texts = [self._texts.pop(id(p), None) for p in batch]
        pairs = [(r, t) for r, t in zip(added, texts, strict=True) if t is not None]
        if target is None or not pairs:
            return 0
        return self.service.texts.store(target, [r for r, _ in pairs], [t for _, t in pairs])

    async def fill_missing(
        self, target: CollectionState | None, stop: asyncio.Event, clock: StageClock | None = None
    ) -> int:
        """Read the collection's items that have no text yet (see the module docstring; timed as `ocr`
        on `clock`); returns how many."""
        if target is None or not self.service.texts.wanted(target) or stop.is_set():
            return 0
        try:
            with (clock or StageClock()).sharing("ocr"):
                fill = await self.service.texts.fill(target.name, stop=stop)
        except EncoderUnavailable:  # logged once by the reader; `cnclip ocr` reads them once it loads
            return 0
        if fill.unreadable:
            log.info("%s: %d items not read for text (files gone or changed)", target.name, len(fill.unreadable))
        return fill.read
