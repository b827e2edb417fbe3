"""The words the demo's pictures are made of: shapes, colours, backgrounds, textures, positions,
sizes and counts, and `Attributes`, the record of what one picture shows.

A leaf both halves of the dataset build on: demo/drawing.py paints `Attributes`, demo/dataset.py
samples them and writes the captions (it imports the drawing, never the reverse).
"""

from __future__ import annotations

from dataclasses import dataclass

IMAGE_SIZE = 224

# canonical name -> caption words (synonyms). The canonical name is the tag and the zero-shot label.
SHAPES: dict[str, tuple[str, ...]] = {
    "圆形": ("圆形", "圆", "圆圈"),
    "正方形": ("正方形", "方块", "方形"),
    "三角形": ("三角形", "三角"),
    "星形": ("星形", "星星", "五角星"),
    "心形": ("心形", "爱心"),
    "菱形": ("菱形",),
    "十字形": ("十字形", "十字"),
}
COLOURS: dict[str, tuple[int, int, int]] = {
    "红色": (220, 30, 35),
    "橙色": (250, 135, 10),
    "黄色": (245, 215, 20),
    "绿色": (35, 165, 60),
    "蓝色": (35, 80, 225),
    "紫色": (135, 45, 195),
    "黑色": (20, 20, 20),
    "白色": (250, 250, 250),
    "粉色": (250, 140, 190),
    "棕色": (125, 75, 30),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "白色": (238, 238, 238),
    "黑色": (35, 35, 35),
    "灰色": (140, 140, 140),
    "蓝色": (70, 120, 215),
    "绿色": (80, 170, 90),
    "黄色": (240, 220, 90),
}
TEXTURES = ("纯色", "条纹", "格子", "圆点")
POSITIONS = {"左边": (0.27, 0.5), "右边": (0.73, 0.5), "上面": (0.5, 0.27), "下面": (0.5, 0.73), "中间": (0.5, 0.5)}
SIZES = ("大", "小")
COUNT_WORDS = {1: "一", 2: "两", 3: "三"}
# Attribute keys a caption can name, and every value each can take.
KEYS = ("shape", "colour", "count", "size", "position", "background", "texture")
VALUES: dict[str, tuple[object, ...]] = {
    "shape": tuple(SHAPES),
    "colour": tuple(COLOURS),
    "count": (1, 2, 3),
    "size": SIZES,
    "position": (*POSITIONS, None),
    "background": tuple(BACKGROUNDS),
    "texture": TEXTURES,
}


@dataclass(frozen=True)
class Attributes:
    shape: str
    colour: str
    count: int
    size: str
    position: str | None  # only single objects have a position
    background: str
    texture: str

    def matches(self, named: dict[str, object]) -> bool:
        """True when this picture has every attribute value a caption names."""
        return all(getattr(self, k) == v for k, v in named.items())
