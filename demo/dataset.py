"""The demo's captioned image set: coloured shapes on plain or textured backgrounds, drawn with Pillow.

Everything is a pure function of a seed, so the training script, the evaluation, the tests and
`cnclip demo` all see the same pictures without storing any. Every sample carries its attributes,
and every caption records which attributes it names, so "a hit matches every attribute the query
names" can be computed exactly (many pictures share one description).

Held-out data differs from training data in two ways: its (shape, colour, background, texture, count)
combinations never occur in training, and its captions come from templates training never saw.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from PIL import Image

from demo.drawing import render as draw
from demo.vocabulary import (
    BACKGROUNDS,
    COLOURS,
    COUNT_WORDS,
    POSITIONS,
    SHAPES,
    SIZES,
    TEXTURES,
    Attributes,
)


@dataclass(frozen=True)
class Caption:
    text: str
    named: dict[str, object]  # the attributes this text names, with their values


@dataclass(frozen=True)
class Sample:
    index: int
    attributes: Attributes

    def image(self) -> Image.Image:
        return draw(self.attributes, seed=self.index)


# ---- the split ----------------------------------------------------------------------------------


def _all_combos() -> list[tuple[str, str, str]]:
    return [(s, c, b) for s in SHAPES for c in COLOURS for b in BACKGROUNDS if b != c]


HELDOUT_PERCENT = 15
COMBO_KEYS = ("shape", "colour", "background", "texture", "count")


def is_heldout(attrs: Attributes) -> bool:
    """True for the held-out (shape, colour, background, texture, count) combinations: 15 % of them,
    chosen by a stable hash. Every pair and triple of these still occurs in training, so the split
    creates no shortcut (such as "this colour on this background is never a star") that a model
    could learn instead of looking at the shape; held-out pictures are new combinations of known words.
    """
    key = "|".join(str(getattr(attrs, k)) for k in COMBO_KEYS)
    return int(hashlib.md5(key.encode("utf-8")).hexdigest(), 16) % 100 < HELDOUT_PERCENT


def sample_attributes(rng: random.Random, combos: list[tuple[str, str, str]]) -> Attributes:
    shape, colour, background = rng.choice(combos)
    count = rng.choice((1, 1, 2, 3))
    return Attributes(
        shape=shape,
        colour=colour,
        count=count,
        size=rng.choice(SIZES),
        position=rng.choice(list(POSITIONS)) if count == 1 else None,
        background=background,
        texture=rng.choice(TEXTURES),
    )


def sample_split(rng: random.Random, split: str) -> Attributes:
    """Random attributes of the `train`, `heldout` or `all` split."""
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"unknown split {split!r}")
    while True:
        attrs = sample_attributes(rng, _all_combos())
        if split == "all" or is_heldout(attrs) == (split == "heldout"):
            return attrs


def samples(split: str, n: int, seed: int) -> list[Sample]:
    """`n` samples of the `train` or `heldout` split; sample i's picture is a pure function of (seed, i)."""
    rng = random.Random(f"{split}:{seed}")
    return [Sample(index=seed * 1_000_003 + i, attributes=sample_split(rng, split)) for i in range(n)]


def demo_gallery(n: int = 300, seed: int = 7) -> list[Sample]:
    """The gallery `cnclip demo` indexes: every (shape, colour) pair at least once, then random ones."""
    rng = random.Random(f"demo:{seed}")
    combos = _all_combos()
    out: list[Sample] = []
    pairs = [(s, c) for s in SHAPES for c in COLOURS]
    for i in range(n):
        if i < len(pairs):
            shape, colour = pairs[i]
            pool = [t for t in combos if t[0] == shape and t[1] == colour]
            attrs = sample_attributes(rng, pool)
        else:
            attrs = sample_attributes(rng, combos)
        out.append(Sample(index=10_000_000 + seed * 100_003 + i, attributes=attrs))
    return out


# ---- captions -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    pattern: str
    keys: tuple[str, ...]  # the attributes it names
    single_only: bool = False  # needs a single object (position, "一个…")


TRAIN_TEMPLATES = (
    Template("{n}{c}的{s}", ("count", "colour", "shape")),
    Template("{n}{c}的{s}在{p}", ("count", "colour", "shape", "position"), single_only=True),
    Template("{b}背景上的{c}{s}", ("background", "colour", "shape")),
    Template("{c}{s}", ("colour", "shape")),
    Template("{s}", ("shape",)),
    Template("{c}的图形", ("colour",)),
    Template("一张{c}{s}的图片", ("colour", "shape")),
    Template("{n}{z}的{c}{s}", ("count", "size", "colour", "shape")),
    Template("画面{p}有{n}{c}{s}", ("position", "count", "colour", "shape"), single_only=True),
    Template("{t}背景", ("texture",)),
    Template("{b}背景", ("background",)),
    Template("{t}背景上有{n}{s}", ("texture", "count", "shape")),
    Template("这张照片里是{c}的{s}", ("colour", "shape")),
    Template("{n}{s}", ("count", "shape")),
    Template("{z}{s}", ("size", "shape")),
    Template("{c}的{s}和{b}的{t}背景", ("colour", "shape", "background", "texture")),
    Template("{b}底色上画着{n}{s}", ("background", "count", "shape")),
    Template("{s}的照片", ("shape",)),
    Template("{c}的照片", ("colour",)),
    Template("{z}的{c}{s}位于{p}", ("size", "colour", "shape", "position"), single_only=True),
    # "背景是…" with the colour after the word: without these, every background colour in training
    # came before 背景, and the first fully trained model read the held-out "{c}{s}，背景是{b}的" as
    # a {b} object on a {c} background (103 of its 122 image → text misses). Neither is that template.
    Template("{n}{s}，背景是{b}", ("count", "shape", "background")),
    Template("背景是{b}，上面有{n}{c}{s}", ("background", "count", "colour", "shape")),
)
# Phrasings the model never trains on: the held-out queries.
HELDOUT_TEMPLATES = (
    Template("{c}的{s}", ("colour", "shape")),
    Template("图片里有{n}{c}的{s}", ("count", "colour", "shape")),
    Template("{c}{s}，背景是{b}的", ("colour", "shape", "background")),
    Template("{p}有一个{c}的{s}", ("position", "count", "colour", "shape"), single_only=True),
    Template("{t}背景前的{c}{s}", ("texture", "colour", "shape")),
    Template("很{z}的{c}{s}", ("size", "colour", "shape")),
)


# Photo-caption frames that web captions carry ("一张…的照片"); training wraps some captions in them so
# that such words read as neutral, as zero-shot prompt templates need.
FRAMES = (
    "一张{}的照片",
    "一张{}的图片",
    "{}的照片",
    "这是{}",
    "一张清晰的{}的照片",
    "一张模糊的{}的照片",
    "{}的特写",
    "这是一张{}的照片",
)


def _measure(shape_word: str) -> str:
    return "颗" if shape_word in ("星星", "五角星", "爱心") else "个"


def fill(template: Template, attrs: Attributes, rng: random.Random) -> Caption:
    """Write `template` for `attrs`, picking synonyms with `rng`."""
    shape_word = rng.choice(SHAPES[attrs.shape])
    text = template.pattern.format(
        n=COUNT_WORDS[attrs.count] + _measure(shape_word),
        c=attrs.colour,
        s=shape_word,
        p=attrs.position or "",
        z=attrs.size,
        b=attrs.background,
        t=attrs.texture,
    )
    values = asdict(attrs)
    return Caption(text=text, named={k: values[k] for k in template.keys})


def usable(templates: tuple[Template, ...], attrs: Attributes) -> list[Template]:
    return [t for t in templates if attrs.count == 1 or not t.single_only]


def caption(
    attrs: Attributes, rng: random.Random, templates: tuple[Template, ...] = TRAIN_TEMPLATES, framed: float = 0.0
) -> Caption:
    """A random caption of `attrs` from `templates`, wrapped in a photo frame with probability `framed`."""
    cap = fill(rng.choice(usable(templates, attrs)), attrs, rng)
    if framed and rng.random() < framed:
        cap = Caption(rng.choice(FRAMES).format(cap.text), cap.named)
    return cap


def tags(attrs: Attributes) -> list[str]:
    """Short labels of a picture (stored beside it, and a text collection for image → text)."""
    out = [
        attrs.shape,
        attrs.colour,
        f"{attrs.background}背景",
        f"{attrs.texture}背景",
        f"{COUNT_WORDS[attrs.count]}个",
    ]
    if attrs.position:
        out.append(attrs.position)
    return out


def tag_captions(attrs: Attributes) -> list[Caption]:
    """The tags as captions with the attributes they name."""
    out = [
        Caption(attrs.shape, {"shape": attrs.shape}),
        Caption(attrs.colour, {"colour": attrs.colour}),
        Caption(f"{attrs.background}背景", {"background": attrs.background}),
        Caption(f"{attrs.texture}背景", {"texture": attrs.texture}),
    ]
    return out


def iter_images(items: list[Sample]) -> Iterator[tuple[Sample, Image.Image]]:
    for s in items:
        yield s, s.image()


def render(attrs: Attributes, seed: int) -> Image.Image:
    """Draw the picture of `attrs` (demo/drawing.py)."""
    return draw(attrs, seed)
