"""The collection service's use cases that also need the model: a text or image search, an upload.
Each is one call for a route: resolve the collection (SQL, before any model work: an unknown
collection is a 404 at once), embed, then search or add, the blocking parts off the event loop
(anyio's worker threads, as the API's own `run_blocking`). So a request walks each layer once:
route → service → catalog and engine, and the encoder.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio.to_thread
import numpy as np

from indexer.domain.exclusion import Exclusion, excluded_texts
from indexer.domain.paging import PageRequest
from indexer.domain.records import AddResult, CollectionKind, ItemRecord, NewImage, NewText, SearchFilters
from indexer.errors import GenerationMoved
from retrieval.errors import EncoderUnavailable
from retrieval.preprocess import ImageHeader
from retrieval.types import Encoder

if TYPE_CHECKING:
    from indexer.domain.records import CollectionState
    from indexer.domain.results import SearchPage, StageMark

T = TypeVar("T")
TEXT_BATCH = 64  # texts per encoder call when adding many
SWAP_RETRIES = 2  # a search or an add that meets a model generation swap embeds again with the new model


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call (SQL, the engine, PIL) in a worker thread and await its result."""
    return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))


def warm(encoder: Encoder | None) -> Encoder:
    """The model, warm (a request before the warm-up ends, or after a shutdown began, is a 503)."""
    if encoder is None or not encoder.ready:
        raise EncoderUnavailable("the model is not loaded yet; retry in a moment")
    return encoder


class _Service(Protocol):
    """The parts of `CollectionService` (indexer/service/collections.py) the use cases build on."""

    encoder: Encoder | None

    def encoder_for(self, info: CollectionState) -> Encoder: ...

    def resolve(
        self, name: str | None, kind: CollectionKind, action: str = ..., *, answer: bool = ...
    ) -> CollectionState: ...

    def writable(self, name: str, kind: CollectionKind) -> CollectionState: ...

    def search_in(
        self,
        target: CollectionState,
        vector: np.ndarray,
        page: PageRequest,
        filters: SearchFilters | None = ...,
        *,
        exclude: int | None = ...,
        away: Exclusion | None = ...,
        mark: StageMark | None = ...,
    ) -> SearchPage: ...

    def similar(
        self,
        item_id: int,
        page: PageRequest,
        filters: SearchFilters | None = ...,
        *,
        mark: StageMark | None = ...,
    ) -> SearchPage: ...

    def item(self, item_id: int) -> ItemRecord: ...

    def stored_vector(self, collection: str, item_id: int) -> tuple[CollectionState, np.ndarray]: ...

    def complete(self, image: NewImage, header: ImageHeader | None = ...) -> NewImage: ...

    def add_images(
        self,
        name: str,
        images: Sequence[NewImage],
        vectors: np.ndarray,
        *,
        replace: Sequence[int | None] | None = ...,
        vector_key: str | None = ...,
    ) -> list[AddResult]: ...

    def add_texts(
        self, name: str, texts: Sequence[NewText], vectors: np.ndarray, vector_key: str | None = ...
    ) -> list[AddResult]: ...


class UseCases:
    """Mixed into `CollectionService` (indexer/service/collections.py)."""

    async def search_text(
        self: _Service,
        query: str,
        collection: str | None,
        page: PageRequest,
        filters: SearchFilters | None = None,
        *,
        excluded: Sequence[str] = (),
        mark: StageMark | None = None,
    ) -> SearchPage:
        """Images of `collection` (default: the oldest image collection) matching a text, pushed away
        from the `excluded` texts (indexer/domain/exclusion.py)."""
        page.check()
        texts = excluded_texts(excluded)
        for attempt in range(SWAP_RETRIES + 1):
            # before any model work; the generation this process answers with (a swap's previous meanwhile)
            target = await off_loop(self.resolve, collection, "images", answer=True)
            vectors = await warm(self.encoder_for(target)).embed_texts([query, *texts])  # one batch, cached per text
            away = Exclusion.of(texts, vectors[1:], target.vector_key) if texts else None
            if mark:
                mark("encode")
            try:
                return await off_loop(self.search_in, target, vectors[0], page, filters, away=away, mark=mark)
            except GenerationMoved:  # swapped to another model meanwhile: embed again with the new one
                if attempt == SWAP_RETRIES:
                    raise
        raise AssertionError("unreachable")

    async def search_image(
        self: _Service,
        data: bytes,
        collection: str | None,
        target_kind: CollectionKind,
        page: PageRequest,
        filters: SearchFilters | None = None,
        *,
        excluded: Sequence[str] = (),
        mark: StageMark | None = None,
    ) -> SearchPage:
        """Similar images (`target_kind` images) or best-matching texts (texts) for image bytes whose
        header the caller has checked, pushed away from the `excluded` texts."""
        page.check()
        texts = excluded_texts(excluded)
        for attempt in range(SWAP_RETRIES + 1):
            target = await off_loop(self.resolve, collection, target_kind, answer=True)
            encoder = warm(self.encoder_for(target))
            vector = (await encoder.embed_images([data]))[0]
            away = Exclusion.of(texts, await encoder.embed_texts(list(texts)), target.vector_key) if texts else None
            if mark:
                mark("encode")
            try:
                return await off_loop(self.search_in, target, vector, page, filters, away=away, mark=mark)
            except GenerationMoved:
                if attempt == SWAP_RETRIES:
                    raise
        raise AssertionError("unreachable")

    async def similar_to(
        self: _Service,
        item_id: int,
        page: PageRequest,
        filters: SearchFilters | None = None,
        *,
        excluded: Sequence[str] = (),
        mark: StageMark | None = None,
    ) -> SearchPage:
        """Items of the same collection nearest to `item_id` (its stored vector), pushed away from the
        `excluded` texts, embedded by the model of the collection's stored vectors."""
        page.check()
        texts = excluded_texts(excluded)
        if not texts:
            return await off_loop(self.similar, item_id, page, filters, mark=mark)
        for attempt in range(SWAP_RETRIES + 1):
            item = await off_loop(self.item, item_id)
            target, vector = await off_loop(self.stored_vector, item.collection, item_id)
            away = Exclusion.of(texts, await warm(self.encoder_for(target)).embed_texts(list(texts)), target.vector_key)
            if mark:
                mark("encode")
            try:
                return await off_loop(
                    self.search_in, target, vector, page, filters, exclude=item_id, away=away, mark=mark
                )
            except GenerationMoved:
                if attempt == SWAP_RETRIES:
                    raise
        raise AssertionError("unreachable")

    async def add_upload(
        self: _Service,
        collection: str,
        data: bytes,
        header: ImageHeader,
        *,
        caption: str | None = None,
        tags: Sequence[str] = (),
    ) -> AddResult:
        """Add one uploaded image whose header the caller read (`read_header`): its facts and EXIF
        date come from that one read; the encoder decodes the pixels once."""
        image: NewImage | None = None
        for attempt in range(SWAP_RETRIES + 1):  # a swap (or the collection re-created) meanwhile: embed again
            target = await off_loop(self.writable, collection, "images")  # before any model work
            vectors = await warm(self.encoder_for(target)).embed_images([data])
            image = image or self.complete(NewImage(data=data, caption=caption, tags=list(tags)), header)
            try:
                [added] = await off_loop(self.add_images, collection, [image], vectors, vector_key=target.vector_key)
                return added
            except GenerationMoved:
                if attempt == SWAP_RETRIES:
                    raise
        raise AssertionError("unreachable")

    async def add_text_items(self: _Service, collection: str, texts: Sequence[NewText]) -> list[AddResult]:
        """Add texts to a text collection, embedded `TEXT_BATCH` at a time."""
        target = await off_loop(self.writable, collection, "texts")
        added: list[AddResult] = []
        for start in range(0, len(texts), TEXT_BATCH):
            chunk = list(texts[start : start + TEXT_BATCH])
            for attempt in range(SWAP_RETRIES + 1):  # as `add_upload`: a swap meanwhile, embed again
                vectors = await warm(self.encoder_for(target)).embed_texts([t.text for t in chunk])
                try:
                    added += await off_loop(self.add_texts, collection, chunk, vectors, target.vector_key)
                    break
                except GenerationMoved:
                    if attempt == SWAP_RETRIES:
                        raise
                    target = await off_loop(self.writable, collection, "texts")
        return added
