"""Photo-like pictures with Chinese text for the text-in-photos tests (issue 32): shop signs and phone
screenshots rendered with the CJK font `make install` brings (fonts-wqy-microhei), on noisy gradient
backgrounds with a few shapes (as a photo has), and the demo gallery's own pictures (demo/drawing.py)
as photos without text. Seeded: the same pictures every run."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

CJK_FONT = Path("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc")
SIZE = (640, 480)


@dataclass(frozen=True)
class TextPicture:
    """A rendered picture and the text drawn on it (lines as drawn)."""

    name: str
    kind: str  # sign | screenshot
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


# Each text has runs of 1, 2 and 4 characters no other picture holds, and mixes in Latin letters
# and digits where people search for them ("出口B", "9:00").
PICTURES = (
    TextPicture("sign-kaoya", "sign", ("北京烤鸭",)),
    TextPicture("sign-exit", "sign", ("安全出口B",)),
    TextPicture("sign-meeting", "sign", ("会议室 3F",)),
    TextPicture("sign-smoking", "sign", ("禁止吸烟",)),
    TextPicture("sign-floor", "sign", ("小心地滑",)),
    TextPicture("screen-hours", "screenshot", ("营业时间", "9:00-21:00", "周一至周日")),
    TextPicture("screen-ticket", "screenshot", ("火车票", "G1234 上海虹桥", "检票口 15")),
    TextPicture("screen-chat", "screenshot", ("明天下午开会", "记得带笔记本电脑")),
)


def _photo_background(rng: random.Random) -> Image.Image:
    """A vertical two-colour gradient with sensor-like noise and a few soft shapes."""
    width, height = SIZE
    top = np.array([rng.randint(40, 200) for _ in range(3)], dtype=np.float32)
    bottom = np.array([rng.randint(40, 200) for _ in range(3)], dtype=np.float32)
    ramp = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    pixels = top * (1 - ramp) + bottom * ramp + np.zeros((height, width, 3), dtype=np.float32)
    pixels += np.random.default_rng(rng.randint(0, 2**31)).normal(0, 9, pixels.shape)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randint(2, 4)):
        x, y, r = rng.randint(0, width), rng.randint(0, height), rng.randint(20, 90)
        shade = tuple(rng.randint(30, 220) for _ in range(3))
        draw.ellipse([x - r, y - r, x + r, y + r], fill=shade)
    return image


def _sign(picture: TextPicture, rng: random.Random) -> Image.Image:
    """A plate with the text in a contrasting colour, placed somewhere in a photo."""
    image = _photo_background(rng)
    draw = ImageDraw.Draw(image)
    font = ImageFont.truetype(str(CJK_FONT), rng.randint(54, 70))
    text = picture.lines[0]
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    pad = 24
    plate_w, plate_h = right - left + 2 * pad, bottom - top + 2 * pad
    x = rng.randint(10, SIZE[0] - plate_w - 10)
    y = rng.randint(10, SIZE[1] - plate_h - 10)
    plate, ink = rng.choice(
        [((200, 30, 30), (255, 240, 200)), ((20, 90, 40), (255, 255, 255)), ((245, 245, 235), (20, 20, 20))]
    )
    draw.rectangle([x, y, x + plate_w, y + plate_h], fill=plate, outline=(60, 60, 60), width=4)
    draw.text((x + pad - left, y + pad - top), text, font=font, fill=ink)
    return image


def _screenshot(picture: TextPicture, rng: random.Random) -> Image.Image:
    """A phone screen: a status bar, then the lines on a light page."""
    image = Image.new("RGB", SIZE, (248, 248, 250))
    draw = ImageDraw.Draw(image)
    draw.rectangle([0, 0, SIZE[0], 36], fill=(rng.randint(20, 80), rng.randint(60, 140), rng.randint(150, 230)))
    font = ImageFont.truetype(str(CJK_FONT), 40)
    y = 70
    for line in picture.lines:
        draw.text((40, y), line, font=font, fill=(30, 30, 30))
        y += 80
    draw.rectangle([30, y + 10, SIZE[0] - 30, y + 14], fill=(220, 220, 225))
    return image


def render_text_picture(picture: TextPicture, seed: int = 0) -> Image.Image:
    rng = random.Random(f"{picture.name}:{seed}")
    return _sign(picture, rng) if picture.kind == "sign" else _screenshot(picture, rng)


def write_pictures(folder: Path, photos_without_text: int = 8) -> dict[str, TextPicture | None]:
    """JPEGs of every `PICTURES` and of `photos_without_text` demo-gallery pictures in `folder`:
    file name -> the picture's text record (None for a photo without text)."""
    from demo.dataset import demo_gallery

    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, TextPicture | None] = {}
    for picture in PICTURES:
        name = f"{picture.name}.jpg"
        render_text_picture(picture).save(folder / name, "JPEG", quality=90)
        written[name] = picture
    for index, sample in enumerate(demo_gallery(photos_without_text, seed=11)):
        name = f"photo-{index:02d}.jpg"
        sample.image().convert("RGB").resize(SIZE).save(folder / name, "JPEG", quality=90)
        written[name] = None
    return written


def unique_runs(picture: TextPicture, length: int) -> list[str]:
    """Runs of `length` characters of `picture`'s text (spaces dropped, within a line) that no other picture
    of `PICTURES` holds: a search for one has one right answer."""
    others = ["".join(p.text.split()) for p in PICTURES if p is not picture]
    runs = []
    for line in picture.lines:
        compact = "".join(line.split())
        for start in range(len(compact) - length + 1):
            run = compact[start : start + length]
            if not any(run.casefold() in other.casefold() for other in others) and run not in runs:
                runs.append(run)
    return runs
