"""Zero-shot classification: an image and candidate labels in, calibrated probabilities out.

Each label becomes one text per prompt template ("一张{}的照片", ...); the label's embedding is the
mean of those text vectors, renormalised (CLIP's prompt ensembling). Probabilities are
`softmax(logit_scale × cos)` over the labels, where `logit_scale` is the model's multiplier
(100 for the released checkpoints). Label embeddings are cached per (model, templates, label).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from retrieval.errors import InvalidInput
from retrieval.prompts import check_prompts, fill
from retrieval.query_cache import QueryCache
from retrieval.types import Encoder

# Chinese prompt templates in the spirit of Chinese-CLIP's zero-shot evaluation prompts.
DEFAULT_TEMPLATES: tuple[str, ...] = (
    "一张{}的照片",
    "一张{}的图片",
    "{}的照片",
    "一张清晰的{}的照片",
    "一张模糊的{}的照片",
    "一张{}的特写照片",
    "一张小的{}的照片",
    "一张大的{}的照片",
    "这是一张{}的照片",
    "{}",
)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    exp = np.exp(shifted)
    return exp / exp.sum()


class ZeroShotClassifier:
    """Classifies images against free-form labels with an `Encoder`; caches label embeddings (LRU).

    The label cache saves the mean over the templates; the template texts' own vectors also sit in
    the encoder's query cache, so a label that left this cache costs lookups, not a batch."""

    def __init__(self, encoder: Encoder, templates: Sequence[str] = DEFAULT_TEMPLATES, cache_size: int = 4096) -> None:
        self.encoder = encoder
        self.templates = tuple(templates)
        self.cache: QueryCache[tuple[str, tuple[str, ...], str]] = QueryCache(cache_size)  # (model, templates, label)

    @property
    def cache_hits(self) -> int:
        """Labels served from the cache (read by the service's metrics at scrape time)."""
        return self.cache.hits

    @property
    def cache_misses(self) -> int:
        """Labels whose embedding was computed."""
        return self.cache.misses

    async def label_embeddings(self, labels: Sequence[str], templates: Sequence[str] | None = None) -> np.ndarray:
        """(len(labels), dim) float32: per label the renormalised mean of its template texts' vectors."""
        chosen = tuple(templates) if templates is not None else self.templates
        check_prompts(labels, chosen)
        keys = [(self.encoder.model_id, chosen, label) for label in labels]
        found, missing = self.cache.lookup(keys)
        if missing:
            texts = [fill(template, label) for (_, _, label) in missing for template in chosen]
            vectors = np.asarray(await self.encoder.embed_texts(texts), dtype=np.float32)
            means = vectors.reshape(len(missing), len(chosen), -1).mean(axis=1)
            means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), np.float32(1e-12))
            self.cache.store(missing, means)
            found.update(zip(missing, means, strict=True))
        return np.stack([found[key] for key in keys])

    async def classify_vector(
        self, image_vector: np.ndarray, labels: Sequence[str], templates: Sequence[str] | None = None
    ) -> list[tuple[str, float]]:
        """(label, probability) sorted by probability, highest first, for an L2-normalised image vector."""
        label_vectors = await self.label_embeddings(labels, templates)
        image = np.asarray(image_vector, dtype=np.float32).reshape(-1)
        if image.shape[0] != label_vectors.shape[1]:
            raise InvalidInput(f"image vector has {image.shape[0]} dimensions, the model has {label_vectors.shape[1]}")
        probabilities = softmax(self.encoder.logit_scale * (label_vectors @ image).astype(np.float64))
        order = np.argsort(-probabilities, kind="stable")
        return [(labels[i], float(probabilities[i])) for i in order]

    async def classify(
        self, image: bytes, labels: Sequence[str], templates: Sequence[str] | None = None
    ) -> list[tuple[str, float]]:
        """(label, probability) sorted by probability, highest first, for raw image bytes."""
        check_prompts(labels, tuple(templates) if templates is not None else self.templates)
        vector = (await self.encoder.embed_images([image]))[0]
        return await self.classify_vector(vector, labels, templates)
