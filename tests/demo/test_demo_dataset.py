"""The generated captioned picture set: determinism, the split, captions that say what they name."""

from __future__ import annotations

import random

import numpy as np
import pytest

from demo import dataset, vocabulary
from retrieval.tokenizer import default_tokenizer


def test_same_seed_same_pictures_and_attributes() -> None:
    a = dataset.samples("train", 5, seed=3)
    b = dataset.samples("train", 5, seed=3)
    assert [s.attributes for s in a] == [s.attributes for s in b]
    for x, y in zip(a, b, strict=True):
        assert x.image().tobytes() == y.image().tobytes()
    other = dataset.samples("train", 5, seed=4)
    assert [s.attributes for s in other] != [s.attributes for s in a]


def test_pictures_are_224_rgb_and_show_the_object_colour() -> None:
    for s in dataset.samples("all", 30, seed=0):
        img = s.image()
        assert img.size == (224, 224) and img.mode == "RGB"
        pixels = np.asarray(img).reshape(-1, 3).astype(int)
        target = np.array(vocabulary.COLOURS[s.attributes.colour])
        # Some pixels are within the jitter of the object's colour (it was drawn, and not hidden).
        assert (np.abs(pixels - target).max(axis=1) <= 12).sum() > 100, s.attributes


def test_single_objects_sit_where_the_position_says() -> None:
    for s in dataset.samples("all", 60, seed=1):
        a = s.attributes
        if a.count != 1 or a.position == "中间":
            continue
        pixels = np.asarray(s.image()).astype(int)
        mask = np.abs(pixels - np.array(vocabulary.COLOURS[a.colour])).max(axis=2) <= 12
        ys, xs = np.nonzero(mask)
        cx, cy = xs.mean() / 224, ys.mean() / 224
        expected = {"左边": cx < 0.4, "右边": cx > 0.6, "上面": cy < 0.4, "下面": cy > 0.6}
        assert expected[a.position], (a, cx, cy)


def test_heldout_combinations_never_occur_in_training() -> None:
    def combo(s: dataset.Sample) -> tuple:
        return tuple(getattr(s.attributes, k) for k in dataset.COMBO_KEYS)

    train = dataset.samples("train", 3000, seed=0)
    test = dataset.samples("heldout", 300, seed=1)
    assert not {combo(s) for s in train} & {combo(s) for s in test}
    assert all(dataset.is_heldout(s.attributes) for s in test)
    share = sum(dataset.is_heldout(s.attributes) for s in dataset.samples("all", 2000, seed=2)) / 2000
    assert 0.1 < share < 0.2
    # Every (shape, colour, background) triple of the held-out pictures also trains in other
    # combinations: held-out tests composition, and the split leaves no shortcut to learn.
    triples = {(s.attributes.shape, s.attributes.colour, s.attributes.background) for s in train}
    assert {(s.attributes.shape, s.attributes.colour, s.attributes.background) for s in test} <= triples


def test_heldout_templates_are_phrased_differently() -> None:
    train = {t.pattern for t in dataset.TRAIN_TEMPLATES}
    held = {t.pattern for t in dataset.HELDOUT_TEMPLATES}
    assert not train & held
    rng = random.Random(0)
    train_texts = set()
    for s in dataset.samples("train", 400, seed=2):
        for t in dataset.usable(dataset.TRAIN_TEMPLATES, s.attributes):
            train_texts.add(dataset.fill(t, s.attributes, rng).text)
    for s in dataset.samples("heldout", 100, seed=2):
        for t in dataset.usable(dataset.HELDOUT_TEMPLATES, s.attributes):
            cap = dataset.fill(t, s.attributes, rng)
            assert cap.text not in train_texts or t.pattern == "{c}的{s}", cap.text


def test_caption_names_exactly_what_it_says() -> None:
    a = vocabulary.Attributes("星形", "红色", 2, "小", None, "绿色", "条纹")
    rng = random.Random(0)
    cap = dataset.fill(dataset.TRAIN_TEMPLATES[2], a, rng)
    assert cap.text in {"绿色背景上的红色星形", "绿色背景上的红色星星", "绿色背景上的红色五角星"}
    assert cap.named == {"background": "绿色", "colour": "红色", "shape": "星形"}
    assert a.matches(cap.named)
    assert not vocabulary.Attributes("星形", "蓝色", 2, "小", None, "绿色", "条纹").matches(cap.named)
    # "两颗…星星": the measure word follows the noun.
    assert dataset.fill(dataset.Template("{n}{c}的{s}", ("count", "colour", "shape")), a, random.Random(1)).text in {
        "两个红色的星形",
        "两颗红色的星星",
        "两颗红色的五角星",
    }


def test_position_templates_only_for_single_objects() -> None:
    rng = random.Random(0)
    many = vocabulary.Attributes("圆形", "蓝色", 3, "大", None, "白色", "纯色")
    for _ in range(200):
        cap = dataset.caption(many, rng, dataset.HELDOUT_TEMPLATES)
        assert "position" not in cap.named and many.matches(cap.named)


def test_every_caption_word_is_in_the_vocab() -> None:
    tok = default_tokenizer()
    words = [*vocabulary.COLOURS, *vocabulary.BACKGROUNDS, *vocabulary.TEXTURES, *vocabulary.POSITIONS]
    words += [w for ws in vocabulary.SHAPES.values() for w in ws]
    for word in words:
        assert tok.unk_id not in tok.encode(word), word


def test_demo_gallery_covers_every_shape_colour_pair() -> None:
    gallery = dataset.demo_gallery(100)
    pairs = {(s.attributes.shape, s.attributes.colour) for s in gallery}
    assert pairs == {(s, c) for s in vocabulary.SHAPES for c in vocabulary.COLOURS}


def test_unknown_split_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown split"):
        dataset.samples("valid", 1, seed=0)
