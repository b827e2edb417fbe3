"""Text in photos (issue 32), the use cases: a collection's OCR flag, recognition of the images being
added (the indexing pipeline and uploads: read beside the embedding, stored once the items exist),
and `cnclip ocr`'s fill of the items not read yet, resumable, without embedding anything.

The rules, in one place: only image collections have OCR; once on, it stays on for later runs,
uploads and watchers (the flag is the collection's, in SQL); an image that cannot be read is an item
without text (an empty row: done), never a failed file; a file gone or changed since it was indexed is
left unread (reported, read by a later fill once it is back); with the engine unavailable nothing is
stored, so a later fill reads those items. The text is per item, not per model: model migrations,
moves and renames keep it, deletions take it with the item (indexer/storage/sql/text_rows.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from indexer.domain.records import AddResult, CollectionState
from indexer.errors import MediaChanged
from indexer.service.ports import Catalog
from retrieval.errors import EncoderUnavailable, InvalidInput, NotFound
from retrieval.ocr.reader import OcrReader
from retrieval.ocr.types import RecognisedText

FILL_BATCH_PER_THREAD = 4  # items a fill reads per OCR thread before it stores them


@dataclass
class TextFill:
    """What one `cnclip ocr` run did."""

    collection: str
    items: int = 0  # image items of the collection
    missing: int = 0  # items without text when the run started
    read: int = 0  # items read and stored by this run
    with_text: int = 0  # of those, items where some text was found
    unreadable: list[tuple[int, str]] = field(default_factory=list)  # (item id, why) left unread
    interrupted: bool = False
    seconds: float = 0.0
    engine: str = ""

    def as_json(self) -> dict[str, object]:
        return {
            "collection": self.collection,
            "items": self.items,
            "missing": self.missing,
            "read": self.read,
            "with_text": self.with_text,
            "unreadable": len(self.unreadable),
            "interrupted": self.interrupted,
            "seconds": round(self.seconds, 3),
            "photos_per_s": round(self.read / self.seconds, 3) if self.seconds > 0 else None,
            "engine": self.engine,
        }


FillProgress = Callable[[TextFill], None]


class TextCases:
    """Recognition for the collection service, over the catalog's `texts` port and an `OcrReader`
    (None: this process reads no text; OCR collections are then indexed without it)."""

    def __init__(self, catalog: Catalog, reader: OcrReader | None) -> None:
        self.catalog = catalog
        self.reader = reader

    def recognised(self, item_id: int) -> str | None:
        """The text recognised in the item (lines joined by newlines; "" when none was found), None when
        it was not read (a collection without ocr, or not yet). Blocking: call it off the event loop."""
        found = self.catalog.texts.texts_for([item_id]).get(item_id)
        return None if found is None else found.text

    def wanted(self, target: CollectionState) -> bool:
        """Whether images added to `target` are read for text in this process."""
        return target.ocr and target.kind == "images" and self.reader is not None

    def set_ocr(self, name: str, on: bool = True) -> CollectionState:
        """Turn recognition on (or off) for an image collection; blocking."""
        state = self.catalog.collection(name)
        if state.kind != "images":
            raise InvalidInput(f"collection {state.name!r} holds {state.kind}: only image collections have OCR")
        if state.ocr != on:
            self.catalog.texts.set_ocr(state.name, on)
        return self.catalog.collection(name)

    async def read(self, target: CollectionState, images: Sequence[bytes]) -> list[RecognisedText] | None:
        """The text in each image when `target` has OCR (None otherwise, or with the engine unavailable)."""
        if not self.wanted(target) or not images:
            return None
        assert self.reader is not None
        return await self.reader.read_many(images)

    def store(self, target: CollectionState, added: Sequence[AddResult], texts: Sequence[RecognisedText] | None) -> int:
        """Store what `read` found for the items `added` made or found (blocking); returns how many."""
        if texts is None:
            return 0
        found = {result.id: text for result, text in zip(added, texts, strict=True) if result.id}
        return self.catalog.texts.put_texts(target.name, found) if found else 0

    async def fill(
        self,
        name: str,
        *,
        stop: asyncio.Event | None = None,
        limit: int | None = None,
        on_progress: FillProgress | None = None,
    ) -> TextFill:
        """Read every item of the collection that has no text yet (at most `limit`), turning its OCR on;
        a rerun resumes where a stopped one ended. `EncoderUnavailable` when the engine cannot load."""
        state = await asyncio.to_thread(self.set_ocr, name, True)
        engine = await asyncio.to_thread(self.reader.engine) if self.reader is not None else None
        if engine is None:
            why = self.reader.failure if self.reader is not None else "this process has no OCR reader"
            raise EncoderUnavailable(f"OCR is unavailable: {why}")
        stop = stop or asyncio.Event()
        report = on_progress or (lambda _fill: None)
        items = (await asyncio.to_thread(self.catalog.get_collection, state.name)).items
        done, _ = await asyncio.to_thread(self.catalog.texts.text_counts, state.name)
        fill = TextFill(state.name, items=items, missing=max(0, items - done), engine=engine.name)
        started = time.perf_counter()
        report(fill)
        batch = FILL_BATCH_PER_THREAD * (self.reader.threads if self.reader is not None else 1)
        after = 0
        while not stop.is_set() and (limit is None or fill.read < limit):
            size = batch if limit is None else min(batch, limit - fill.read)
            ids = await asyncio.to_thread(self.catalog.texts.texts_missing, state.name, after, size)
            if not ids:
                break
            after = ids[-1]
            await self._fill_batch(state, ids, fill)
            fill.seconds = time.perf_counter() - started
            report(fill)
        fill.interrupted = stop.is_set()
        fill.seconds = time.perf_counter() - started
        return fill

    async def _fill_batch(self, state: CollectionState, ids: list[int], fill: TextFill) -> None:
        images = await asyncio.to_thread(self._read_files, ids, fill)
        assert self.reader is not None
        texts = await self.reader.read_many(list(images.values()))
        if texts is None:  # the engine went away under us: nothing stored, a rerun reads them
            raise EncoderUnavailable(f"OCR is unavailable: {self.reader.failure}")
        found = dict(zip(images, texts, strict=True))
        fill.read += await asyncio.to_thread(self.catalog.texts.put_texts, state.name, found)
        fill.with_text += sum(1 for text in found.values() if text.text)

    def _read_files(self, ids: list[int], fill: TextFill) -> dict[int, bytes]:
        """The indexed bytes of each item; one gone or changed since is left unread and reported."""
        found: dict[int, bytes] = {}
        for record in self.catalog.get_many(ids):
            try:
                found[record.id] = self.catalog.read_media(record)
            except (NotFound, MediaChanged) as exc:
                fill.unreadable.append((record.id, str(exc)))
            except OSError as exc:
                fill.unreadable.append((record.id, f"cannot read {record.path}: {exc.strerror or exc}"))
        return found
