"""What the quality gate (retrieval/toolchain/gate.py) runs every candidate on: pictures, queries, and the
batchmates that test how a vector depends on its batch.

- Pictures: half smooth random pictures (the converter's parity set: retrieval/toolchain/convert/parity.py
  uses `parity_images`), half *photo-like* ones: a 1/f colour field (the power spectrum natural photos
  have) under a sky-to-ground gradient, a few blurred shapes, sensor noise, a JPEG round trip at a random
  quality and size, then the service's own preprocessing (retrieval/preprocess.py). Smooth grids alone
  have few edges and no JPEG blocks, so int8 ranges fitted to them can hide errors photos show.
- Queries: the 24 parity sentences and 24 others unlike them — one or two characters, keywords, long
  descriptions cut at the context length, digits, Latin letters, traditional characters, punctuation —
  because an int8 text graph that passed on one kind of sentence was seen to fall to 0.996 on others.
- Hostile batchmates: what a served batch may hold beside an ordinary item (noise, saturated stripes,
  a black and a white frame; runs of one repeated character, a full-length digit string), since
  dynamic int8 computes its activation ranges over the whole batch.

None of these is the int8 calibration set (retrieval/toolchain/convert/openvino_int8.py: rectangles
over a gradient, and its built-in captions), so a calibrated graph is judged on inputs it was not
fitted to. numpy and PIL only, deterministic, no download.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence

import numpy as np

from retrieval.manifest import CNCLIP_MEAN, CNCLIP_STD
from retrieval.preprocess import preprocess_image
from retrieval.tokenizer import tokenize

PARITY_SENTENCES = (
    "穿红色裙子的女孩在公园里放风筝",
    "一只橘猫趴在窗台上晒太阳",
    "雨后的城市街道倒映着霓虹灯",
    "爷爷在院子里给花浇水",
    "一碗热气腾腾的牛肉拉面",
    "海边的日落，天空被染成了橙色",
    "两个孩子在沙滩上堆沙堡",
    "白雪覆盖的山峰和蓝色的湖泊",
    "篮球运动员正在扣篮",
    "桌子上放着一台笔记本电脑和一杯咖啡",
    "一只金毛犬叼着飞盘奔跑",
    "春天的樱花开满了整条街",
    "地铁站里匆匆忙忙的上班族",
    "厨师正在厨房里切菜",
    "夜空中的满月和点点繁星",
    "古老的石桥横跨在小河上",
    "一辆红色的跑车停在路边",
    "妈妈抱着刚出生的婴儿",
    "图书馆里安静看书的学生",
    "秋天金黄色的银杏叶落满地面",
    "草原上奔跑的一群骏马",
    "一盘刚出锅的饺子",
    "戴着安全帽的工人在工地上干活",
    "熊猫抱着竹子吃得很香",
)

VARIED_QUERIES = (
    "猫",
    "日落",
    "红色汽车",
    "婚礼 现场 鲜花",
    "iPhone 15 手机壳",
    "2024年春节联欢晚会舞台",
    "北京故宫 雪景",
    "穿着蓝色牛仔裤和白色T恤的年轻男子站在地铁站台上，一边看手机一边等车，身后的广告牌上写着大大的促销标语",
    "清晨的薄雾笼罩着整个山谷，远处的村庄若隐若现，近处的稻田里有几只白鹭在觅食，一位农民扛着锄头走在田埂上",
    "臺北的夜市小吃攤",
    "一只戴著眼鏡的貓咪",
    "“今天天气真好！”",
    "怎么找到去年夏天在海边拍的照片？",
    "狗狗 vs 猫咪",
    "5个苹果和3根香蕉",
    "NBA总决赛 第7场",
    "黑白老照片：1950年代的上海外滩",
    "无人机俯拍的高速公路立交桥",
    "显微镜下的细胞",
    "手写的数学公式 E=mc²",
    "圣诞树下的礼物盒",
    "宝宝第一次走路",
    "会议室白板上的流程图",
    "宇航员在太空站里漂浮",
)

IMAGE_SAMPLES = 48  # half smooth, half photo-like
PHOTO_SIZES = ((320, 240), (240, 320), (400, 300), (256, 256), (512, 384))


def _normalised(pictures: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    m = np.asarray(mean, dtype=np.float32).reshape(1, 3, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(1, 3, 1, 1)
    return ((pictures - m) / s).astype(np.float32)


def parity_images(count: int, resolution: int, seed: int = 0) -> np.ndarray:
    """`count` smooth random pictures (6×6 colour grids, bicubic-upsampled), cn_clip-normalised:
    float32 [n, 3, R, R]. numpy and PIL only, so the gate runs without torch."""
    from PIL import Image

    grids = np.random.default_rng(seed).random((count, 3, 6, 6), dtype=np.float32)
    out = np.empty((count, 3, resolution, resolution), dtype=np.float32)
    for i in range(count):
        for c in range(3):
            plane = Image.fromarray(grids[i, c], mode="F").resize((resolution, resolution), Image.Resampling.BICUBIC)
            out[i, c] = np.clip(np.asarray(plane, dtype=np.float32), 0.0, 1.0)
    return _normalised(out, CNCLIP_MEAN, CNCLIP_STD)


def _one_over_f(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A colour field in [0, 1] whose amplitude spectrum falls as 1/f, as natural photos' does: [h, w, 3]."""
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    amplitude = 1.0 / np.maximum(np.hypot(fy, fx), 1.0 / max(height, width))
    planes = []
    for _ in range(3):
        phase = np.exp(2j * np.pi * rng.random(amplitude.shape))
        plane = np.fft.irfft2(amplitude * phase, s=(height, width))
        planes.append((plane - plane.min()) / (np.ptp(plane) + 1e-9))
    return np.stack(planes, axis=-1)


def photo_bytes(rng: np.random.Generator) -> bytes:
    """One photo-like JPEG: 1/f colours under a gradient, blurred shapes, sensor noise, random size and quality."""
    from PIL import Image, ImageDraw, ImageFilter

    width, height = PHOTO_SIZES[rng.integers(len(PHOTO_SIZES))]
    top, bottom = rng.random(3), rng.random(3)
    ramp = np.linspace(0.0, 1.0, height)[:, None, None]
    field = _one_over_f(rng, height, width)
    # Photos' colour channels move together: the luminance texture is shared, the chroma is faint.
    texture = 0.7 * field[..., :1] + 0.3 * field
    picture = (top * (1 - ramp) + bottom * ramp) * (0.4 + 0.9 * texture)
    image = Image.fromarray(np.clip(picture * 255, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(rng.integers(2, 7)):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1, y1 = x0 + int(rng.integers(width // 10, width // 2)), y0 + int(rng.integers(height // 10, height // 2))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        else:
            draw.polygon([(x0, y1), ((x0 + x1) // 2, y0), (x1, y1)], fill=colour)
    image = image.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.5))))
    noisy = np.asarray(image, dtype=np.float32) + rng.normal(0, 4.0, (height, width, 3))
    image = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=int(rng.integers(60, 95)))
    return buffer.getvalue()


def photo_like_images(
    count: int, resolution: int, seed: int = 7, mean: Sequence[float] = CNCLIP_MEAN, std: Sequence[float] = CNCLIP_STD
) -> np.ndarray:
    """`count` photo-like JPEGs through the service's preprocessing: float32 [n, 3, R, R]."""
    rng = np.random.default_rng(seed)
    return np.stack([preprocess_image(photo_bytes(rng), resolution, mean, std) for _ in range(count)])


@functools.lru_cache(maxsize=2)
def gate_images(resolution: int, count: int = IMAGE_SAMPLES) -> np.ndarray:
    """The gate's pictures: smooth and photo-like alternating (so every batch holds both kinds).
    Made once per resolution (the gate asks for them per candidate and shape): callers do not modify them."""
    smooth = parity_images(count - count // 2, resolution)
    photos = photo_like_images(count // 2, resolution)
    out = np.empty((count, 3, resolution, resolution), dtype=np.float32)
    out[0::2], out[1::2] = smooth, photos
    return out


def parity_texts(length: int = 52) -> np.ndarray:
    """The parity sentences as cn_clip token ids, int64 [n, length] (cut to `length` tokens)."""
    return tokenize(list(PARITY_SENTENCES), length)


def gate_texts(length: int = 52) -> np.ndarray:
    """The gate's queries, parity sentences and varied ones interleaved: int64 [48, length]."""
    texts = [t for pair in zip(PARITY_SENTENCES, VARIED_QUERIES, strict=True) for t in pair]
    return tokenize(texts, length)


def hostile_mates(tower: str, resolution: int, length: int) -> np.ndarray:
    """Batchmates that stretch dynamic int8's activation ranges: pictures at the extremes preprocessing
    can give (noise, 1-px stripes, black, white), or texts of one repeated token and full-length digits."""
    if tower == "text":
        return tokenize(["。" * 60, "的" * 60, "1234567890" * 10, "哈" * 3], length)
    low = np.asarray(_normalised(np.zeros((1, 3, 1, 1), np.float32), CNCLIP_MEAN, CNCLIP_STD))[0]
    high = np.asarray(_normalised(np.ones((1, 3, 1, 1), np.float32), CNCLIP_MEAN, CNCLIP_STD))[0]
    rng = np.random.default_rng(3)
    stripes = np.broadcast_to(np.arange(resolution) % 2 == 0, (1, resolution, resolution))
    noise = rng.random((1, resolution, resolution)) < 0.5
    pictures = [np.where(mask, high, low) for mask in (noise, stripes)]
    pictures += [np.broadcast_to(low, (3, resolution, resolution)), np.broadcast_to(high, (3, resolution, resolution))]
    return np.stack(pictures).astype(np.float32)
