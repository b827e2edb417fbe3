"""Drawing the demo dataset's pictures (demo/dataset.py describes them): a textured background and
one to three shapes, placed, sized and shaded from a seed."""

from __future__ import annotations

import math
import random

from PIL import Image, ImageDraw

from demo.vocabulary import BACKGROUNDS, COLOURS, IMAGE_SIZE, POSITIONS, Attributes


def _jitter(colour: tuple[int, int, int], rng: random.Random, amount: int) -> tuple[int, int, int]:
    r, g, b = (max(0, min(255, v + rng.randint(-amount, amount))) for v in colour)
    return (r, g, b)


def _tint(colour: tuple[int, int, int]) -> tuple[int, int, int]:
    # Texture marks are a lighter or darker shade of the background, so its colour stays readable.
    lum = sum(colour) / 3
    if lum > 128:
        return (int(colour[0] * 0.8), int(colour[1] * 0.8), int(colour[2] * 0.8))
    return (min(255, colour[0] + 45), min(255, colour[1] + 45), min(255, colour[2] + 45))


def _background(attrs: Attributes, rng: random.Random) -> Image.Image:
    base = _jitter(BACKGROUNDS[attrs.background], rng, 10)
    img = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), base)
    draw = ImageDraw.Draw(img)
    mark = _tint(base)
    step = rng.randint(18, 30)
    if attrs.texture == "条纹":
        for x in range(-IMAGE_SIZE, IMAGE_SIZE, step):
            band = [(x, 0), (x + step // 2, 0), (x + step // 2 + IMAGE_SIZE, IMAGE_SIZE), (x + IMAGE_SIZE, IMAGE_SIZE)]
            draw.polygon(band, fill=mark)
    elif attrs.texture == "格子":
        for y in range(0, IMAGE_SIZE, step):
            for x in range(0, IMAGE_SIZE, step):
                if (x // step + y // step) % 2:
                    draw.rectangle([x, y, x + step - 1, y + step - 1], fill=mark)
    elif attrs.texture == "圆点":
        for y in range(step // 2, IMAGE_SIZE, step):
            for x in range(step // 2, IMAGE_SIZE, step):
                r = step // 5
                draw.ellipse([x - r, y - r, x + r, y + r], fill=mark)
    return img


def _regular(cx: float, cy: float, r: float, n: int, start: float) -> list[tuple[float, float]]:
    return [
        (cx + r * math.cos(start + 2 * math.pi * k / n), cy + r * math.sin(start + 2 * math.pi * k / n))
        for k in range(n)
    ]


def _star(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    pts = []
    for k in range(10):
        rad = r if k % 2 == 0 else r * 0.42
        a = -math.pi / 2 + math.pi * k / 5
        pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
    return pts


def _heart(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    pts = []
    for k in range(48):
        t = 2 * math.pi * k / 48
        x = 16 * math.sin(t) ** 3
        y = 13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t)
        pts.append((cx + x * r / 17, cy - y * r / 17 + r * 0.1))
    return pts


def _cross(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    w = r * 0.36
    return [
        (cx - w, cy - r), (cx + w, cy - r), (cx + w, cy - w), (cx + r, cy - w), (cx + r, cy + w), (cx + w, cy + w),
        (cx + w, cy + r), (cx - w, cy + r), (cx - w, cy + w), (cx - r, cy + w), (cx - r, cy - w), (cx - w, cy - w),
    ]  # fmt: skip


def _draw_shape(
    draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill: tuple[int, int, int]
) -> None:
    if shape == "圆形":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "正方形":
        s = r * 0.85
        draw.rectangle([cx - s, cy - s, cx + s, cy + s], fill=fill)
    elif shape == "三角形":
        draw.polygon(_regular(cx, cy + r * 0.15, r * 1.05, 3, -math.pi / 2), fill=fill)
    elif shape == "星形":
        draw.polygon(_star(cx, cy, r * 1.05), fill=fill)
    elif shape == "心形":
        draw.polygon(_heart(cx, cy, r), fill=fill)
    elif shape == "菱形":
        draw.polygon([(cx, cy - r), (cx + r * 0.68, cy), (cx, cy + r), (cx - r * 0.68, cy)], fill=fill)
    elif shape == "十字形":
        draw.polygon(_cross(cx, cy, r), fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}")


def _centres(attrs: Attributes, r: float, rng: random.Random) -> list[tuple[float, float]]:
    if attrs.count == 1:
        assert attrs.position is not None
        fx, fy = POSITIONS[attrs.position]
        return [(fx * IMAGE_SIZE + rng.uniform(-8, 8), fy * IMAGE_SIZE + rng.uniform(-8, 8))]
    centres: list[tuple[float, float]] = []
    margin = r + 4
    for _ in range(500):
        c = (rng.uniform(margin, IMAGE_SIZE - margin), rng.uniform(margin, IMAGE_SIZE - margin))
        if all(math.dist(c, o) > 2 * r + 6 for o in centres):
            centres.append(c)
            if len(centres) == attrs.count:
                return centres
    # Crowded: fall back to a fixed row, which always fits.
    return [(IMAGE_SIZE * (k + 1) / (attrs.count + 1), IMAGE_SIZE / 2) for k in range(attrs.count)]


def render(attrs: Attributes, seed: int) -> Image.Image:
    """Draw the picture of `attrs` (224×224 RGB); `seed` varies placement, shade and texture scale."""
    rng = random.Random(seed)
    img = _background(attrs, rng)
    draw = ImageDraw.Draw(img)
    if attrs.count == 1:
        r = IMAGE_SIZE * (rng.uniform(0.2, 0.23) if attrs.size == "大" else rng.uniform(0.13, 0.15))
    else:
        r = IMAGE_SIZE * (rng.uniform(0.155, 0.17) if attrs.size == "大" else rng.uniform(0.105, 0.12))
    fill = _jitter(COLOURS[attrs.colour], rng, 12)
    for cx, cy in _centres(attrs, r, rng):
        _draw_shape(draw, attrs.shape, cx, cy, r, fill)
    return img
