"""The collection service's additions: the images and texts the indexing pipeline embedded (blocking),
and the uploads a route hands over (async: resolve the collection before any model work, embed, add,
the blocking parts off the event loop, indexer/service/blocking.py). Held by `CollectionService`
(indexer/service/collections.py) as `writes`.

A collection only takes vectors of the model it was embedded with (`check_generation`); an add that
meets a model generation swap embeds again with the new model (`SWAP_RETRIES`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from indexer.domain.perceptual import phash_of_bytes, phash_or_none
from indexer.domain.records import AddResult, CollectionState, NewImage, NewText
from indexer.domain.taken import taken_from
from indexer.errors import GenerationMoved
from indexer.service.blocking import off_loop, warm
from indexer.service.migration_cases import SWAP_RETRIES, MigrationCases
from indexer.service.ports import ItemStore
from indexer.service.resolver import CollectionResolver
from indexer.service.texts import TextCases
from retrieval.encoder import LocalEncoder
from retrieval.errors import InvalidImage
from retrieval.preprocess import ImageHeader, read_header
from retrieval.types import Encoder

TEXT_BATCH = 64  # texts per encoder call when adding many


class WriteCases:
    """Over the item rows and vectors of `items`; `resolver` checks a collection before anything is
    embedded for it, `migration` which encoder and generation take the vectors, `texts` reads an
    upload's text (OCR) beside its embedding. An image header is read within `max_image_bytes` and
    `max_image_pixels`."""

    def __init__(
        self,
        items: ItemStore,
        resolver: CollectionResolver,
        migration: MigrationCases,
        texts: TextCases,
        *,
        max_image_bytes: int,
        max_image_pixels: int,
    ) -> None:
        self.items = items
        self.resolver = resolver
        self.migration = migration
        self.texts = texts
        self.max_image_bytes = max_image_bytes
        self.max_image_pixels = max_image_pixels

    def add_images(
        self,
        name: str | CollectionState,
        images: Sequence[NewImage],
        vectors: np.ndarray,
        *,
        replace: Sequence[int | None] | None = None,
        vector_key: str | None = None,
    ) -> list[AddResult]:
        """Add images. Each comes with what its header says (mime, size, date), read once by the
        caller (`read_header`: the pipeline's reader, an upload's check) or here when it did not;
        its `taken_at` follows indexer/domain/taken.py (an upload: its EXIF date, else now). `vector_key`: the
        generation the vectors were made for (None: the default encoder's, check_generation)."""
        target = self.migration.check_generation(self.resolver.writable(name, "images"), vector_key)
        completed = [self.complete(image) for image in images]
        return self.items.add_images(target, completed, vectors, replace=replace, vector_key=target.vector_key)

    def load_images(
        self,
        target: CollectionState,
        images: Sequence[NewImage],
        vectors: np.ndarray,
        *,
        replace: Sequence[int | None] | None = None,
        vector_key: str | None = None,
    ) -> list[AddResult]:
        """`add_images` of a bulk load (a shard of `cnclip index --ray`): images that carry their header's
        facts, date and size already (their bytes are not here), written in one transaction by the
        database's bulk path (PostgreSQL COPY)."""
        target = self.migration.check_generation(self.resolver.writable(target, "images"), vector_key)
        return self.items.load_images(target, images, vectors, replace=replace, vector_key=target.vector_key)

    def add_texts(
        self, name: str | CollectionState, texts: Sequence[NewText], vectors: np.ndarray, vector_key: str | None = None
    ) -> list[AddResult]:
        """Add texts embedded for the generation `vector_key` (None: the default encoder's)."""
        target = self.migration.check_generation(self.resolver.writable(name, "texts"), vector_key)
        return self.items.add_texts(target, texts, vectors, vector_key=target.vector_key)

    def complete(self, image: NewImage, header: ImageHeader | None = None) -> NewImage:
        """`image` with its header's facts and its date filled in (one header read, when needed), and an
        upload's perceptual hash."""
        if image.mime is None:
            header = header or read_header(image.data, self.max_image_bytes, self.max_image_pixels)
            image = replace(image, mime=header.mime, width=header.width, height=header.height)
        if image.taken_at is None:
            if header is None:  # only the date is missing: bytes whose header cannot be read date by mtime/now
                with contextlib.suppress(InvalidImage):
                    header = read_header(image.data, self.max_image_bytes, self.max_image_pixels)
            taken_at, taken_source = taken_from(header, image.mtime)
            image = replace(image, taken_at=taken_at, taken_source=taken_source)
        if image.phash is None and image.path is None:
            # An upload's perceptual hash (near-duplicates); the bulk indexer's reader takes its files'.
            image = replace(image, phash=phash_of_bytes(image.data, self.max_image_bytes, self.max_image_pixels))
        return image

    async def add_upload(
        self,
        collection: str | CollectionState,
        data: bytes,
        header: ImageHeader,
        *,
        caption: str | None = None,
        tags: Sequence[str] = (),
    ) -> AddResult:
        """Add one uploaded image whose header the caller read (`read_header`): its facts and EXIF
        date come from that one read; the encoder decodes the pixels once. `collection`: its name, or
        the state `writable` returned (the route's, before the upload was read): one read of its row."""
        image: NewImage | None = None
        target = await off_loop(self.resolver.writable, collection, "images")  # before any model work
        reading = asyncio.ensure_future(self.texts.read(target, [data]))  # OCR beside the embedding
        try:
            for attempt in range(SWAP_RETRIES + 1):  # a swap (or the collection re-created) meanwhile: embed again
                vectors, phash = await embed_hashing(warm(self.migration.encoder_for(target)), data)
                new = NewImage(data=data, caption=caption, tags=list(tags), phash=phash)
                image = image or self.complete(new, header)
                try:
                    [added] = await off_loop(self.add_images, target, [image], vectors, vector_key=target.vector_key)
                    await off_loop(self.texts.store, target, [added], await reading)
                    return added
                except GenerationMoved:
                    if attempt == SWAP_RETRIES:
                        raise
                    target = await off_loop(self.resolver.writable, target.name, "images")
        finally:
            reading.cancel()  # done when it was stored; else not wanted any more
        raise AssertionError("unreachable")

    async def add_text_items(self, collection: str | CollectionState, texts: Sequence[NewText]) -> list[AddResult]:
        """Add texts to a text collection, embedded `TEXT_BATCH` at a time (its row read once, again
        only after a swap)."""
        target = await off_loop(self.resolver.writable, collection, "texts")
        added: list[AddResult] = []
        for start in range(0, len(texts), TEXT_BATCH):
            chunk = list(texts[start : start + TEXT_BATCH])
            for attempt in range(SWAP_RETRIES + 1):  # as `add_upload`: a swap meanwhile, embed again
                vectors = await warm(self.migration.encoder_for(target)).embed_texts([t.text for t in chunk])
                try:
                    added += await off_loop(self.add_texts, target, chunk, vectors, target.vector_key)
                    break
                except GenerationMoved:
                    if attempt == SWAP_RETRIES:
                        raise
                    target = await off_loop(self.resolver.writable, target.name, "texts")
        return added


async def embed_hashing(encoder: Encoder, data: bytes) -> tuple[np.ndarray, int | None]:
    """An upload's vectors and, from the decode its pixels come from, its perceptual hash (the local
    encoder's; any other decodes elsewhere, and `WriteCases.complete` hashes the bytes)."""
    if not isinstance(encoder, LocalEncoder):
        return await encoder.embed_images([data]), None
    hashes: dict[int, int | None] = {}
    vectors = await encoder.embed_images([data], on_decoded=lambda i, image: hashes.update({i: phash_or_none(image)}))
    return vectors, hashes.get(0)
