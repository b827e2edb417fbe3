"""Zero-shot classification: prompt ensembling, calibrated softmax, the label cache."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from PIL import Image

from api.config import Settings
from retrieval.encoder import LocalEncoder
from retrieval.errors import InvalidInput
from retrieval.fake import FakeEncoder
from retrieval.zeroshot import DEFAULT_TEMPLATES, ZeroShotClassifier

LABELS = ["猫", "狗", "汽车"]


def test_default_templates_are_chinese_prompts() -> None:
    assert DEFAULT_TEMPLATES[0] == "一张{}的照片"
    assert len(DEFAULT_TEMPLATES) >= 5 and all(t.count("{}") == 1 for t in DEFAULT_TEMPLATES)


def test_label_embedding_is_the_renormalised_template_mean() -> None:
    encoder = FakeEncoder(dim=16)
    classifier = ZeroShotClassifier(encoder, templates=["一张{}的照片", "{}的图片"])
    got = asyncio.run(classifier.label_embeddings(["猫"]))[0]
    vectors = encoder.embed_texts_sync(["一张猫的照片", "猫的图片"])
    mean = vectors.mean(axis=0)
    assert np.allclose(got, mean / np.linalg.norm(mean), atol=1e-6)
    assert abs(np.linalg.norm(got) - 1) < 1e-6


def test_probabilities_are_softmax_of_scaled_cosines() -> None:
    encoder = FakeEncoder(dim=16, logit_scale=50.0)
    classifier = ZeroShotClassifier(encoder)
    image = b"some image bytes"
    result = asyncio.run(classifier.classify(image, LABELS))
    image_vector = encoder.embed_images_sync([image])[0]
    labels = asyncio.run(classifier.label_embeddings(LABELS))
    logits = 50.0 * (labels @ image_vector).astype(np.float64)
    expected = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    by_label = dict(result)
    assert [label for label, _ in result] == sorted(LABELS, key=lambda x: -by_label[x])
    assert sum(by_label.values()) == pytest.approx(1.0)
    for label, p in zip(LABELS, expected, strict=True):
        assert by_label[label] == pytest.approx(p, rel=1e-6, abs=1e-12)


def test_an_image_matches_a_label_whose_text_embeds_identically() -> None:
    """With a template of just "{}", a label embedding equals that text's vector: cos = 1 wins."""

    class Mirror(FakeEncoder):
        async def embed_images(self, images):  # the image "shows" the text 狗
            return self.embed_texts_sync(["狗"])

    classifier = ZeroShotClassifier(Mirror(dim=64), templates=["{}"])
    ranked = asyncio.run(classifier.classify(b"x", LABELS))
    assert ranked[0][0] == "狗" and ranked[0][1] > 0.99


def test_label_embeddings_are_cached_and_evicted_lru() -> None:
    encoder = FakeEncoder()
    classifier = ZeroShotClassifier(encoder, cache_size=3)

    async def scenario() -> None:
        await classifier.classify_vector(encoder.embed_images_sync([b"a"])[0], LABELS)
        assert encoder.calls == [("text", 3 * len(DEFAULT_TEMPLATES))]
        await classifier.classify_vector(encoder.embed_images_sync([b"b"])[0], LABELS)
        assert len(encoder.calls) == 1  # all three labels cached
        await classifier.label_embeddings(["猫", "飞机"])  # only 飞机 is new; evicts the LRU label 狗
        assert encoder.calls[-1] == ("text", len(DEFAULT_TEMPLATES))
        await classifier.label_embeddings(["汽车"])
        assert len(encoder.calls) == 2
        await classifier.label_embeddings(["狗"])
        assert len(encoder.calls) == 3
        # Other templates are other cache entries.
        await classifier.label_embeddings(["猫"], templates=["{}"])
        assert encoder.calls[-1] == ("text", 1)

    asyncio.run(scenario())


def test_classify_vector_equals_classify() -> None:
    encoder = FakeEncoder()
    classifier = ZeroShotClassifier(encoder)
    by_bytes = asyncio.run(classifier.classify(b"img", LABELS, templates=["{}", "一张{}的照片"]))
    vector = encoder.embed_images_sync([b"img"])[0]
    by_vector = asyncio.run(classifier.classify_vector(vector, LABELS, templates=["{}", "一张{}的照片"]))
    assert by_bytes == by_vector


@pytest.mark.parametrize(
    ("labels", "templates", "message"),
    [
        ([], None, "at least one label"),
        (["猫", "猫"], None, "distinct"),
        (["猫", " "], None, "non-empty"),
        (["猫"], ["没有占位符"], "exactly one"),
        (["猫"], ["{}{}"], "exactly one"),
        (["猫"], [], "between 1 and"),
    ],
)
def test_bad_requests(labels, templates, message) -> None:
    classifier = ZeroShotClassifier(FakeEncoder())
    with pytest.raises(InvalidInput, match=message):
        asyncio.run(classifier.classify(b"img", labels, templates))


def test_with_the_local_encoder(settings: Settings) -> None:
    async def main():
        encoder = LocalEncoder(settings.model_copy(update={"buckets": [1, 4, 8, 16, 32]}))
        await encoder.start()
        try:
            return await ZeroShotClassifier(encoder).classify(_png(), LABELS)  # 30 template texts: one bucket
        finally:
            await encoder.close()

    ranked = asyncio.run(main())
    assert {label for label, _ in ranked} == set(LABELS)
    assert sum(p for _, p in ranked) == pytest.approx(1.0)
    assert ranked == sorted(ranked, key=lambda x: -x[1])


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(buffer, "PNG")
    return buffer.getvalue()


def test_prompt_texts_come_from_the_encoders_query_cache(settings: Settings) -> None:
    """A second classification needs no text batch even without the label cache, and a search query
    equal to a prompt text is answered from the same cache."""
    text_rows: list[int] = []

    class TextBatches:
        def batch_done(self, tower: str, bucket: int, items: int, timings: dict[str, float]) -> None:
            if tower == "text":
                text_rows.append(items)

    async def main() -> tuple[list[tuple[str, float]], list[tuple[str, float]], list[int], list[int]]:
        encoder = LocalEncoder(settings.model_copy(update={"buckets": [1, 4, 8, 16, 32]}), observer=TextBatches())
        await encoder.start()
        try:
            first = await ZeroShotClassifier(encoder, cache_size=0).classify(_png(), LABELS)
            after_first = list(text_rows)
            again = await ZeroShotClassifier(encoder, cache_size=0).classify(_png(), LABELS)
            await encoder.embed_texts(["一张猫的照片"])  # a search query that is one of 猫's prompts
            return first, again, after_first, list(text_rows)
        finally:
            await encoder.close()

    first, again, after_first, after_all = asyncio.run(main())
    assert sum(after_first) == len(LABELS) * len(DEFAULT_TEMPLATES)
    assert after_all == after_first  # no text row ran for the second classification or the query
    assert again == first
