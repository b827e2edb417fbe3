"""Calibrated static int8 (`int8-qdq`) graphs for OpenVINO: NNCF post-training quantization.

ONNX Runtime's int8 (`int8`, retrieval/toolchain/convert/quantize.py) quantizes activations on the fly at
every run. OpenVINO runs int8 fastest with *static* scales: NNCF runs the fp32 graph over a
calibration set, records each quantized activation's range, and writes QuantizeLinear /
DequantizeLinear pairs that OpenVINO folds into int8 kernels (VNNI, AMX). The graph stays ONNX, so
it shares the model directory's layout, weight files and manifest. The output projection stays
float, as in ONNX Runtime's int8: its result *is* the embedding.

Calibration set (activation ranges are fitted to it, so it should look like what will be embedded):
- images: `--calibration-images DIR`, the photos you will index (the best choice), or `cnclip demo`'s
  gallery (DATA_DIR/demo/images) for the demo model. Without it: synthetic pictures unlike the
  parity set's (sharp-edged colour blocks over gradients and noise, another seed), so the gate never
  judges a graph on the inputs it was fitted to;
- texts: `--calibration-texts FILE` (UTF-8, one text per line), or the captions below — everyday
  Chinese photo captions, none of them in the parity sentences.
The quality gate (retrieval/toolchain/gate.py) then decides, per backend and tower, whether the result is good
enough; `cnclip convert` drops a tower's int8-qdq graphs that fail it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import onnx

from retrieval.errors import InvalidInput, ModelError

log = logging.getLogger(__name__)

MAX_IMAGES = 64
MAX_TEXTS = 256
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
CALIBRATION_CAPTIONS = (
    "一家人在餐桌旁吃年夜饭",
    "小狗在草地上追着皮球跑",
    "城市夜景中的高楼大厦",
    "一杯拿铁咖啡放在木桌上",
    "穿校服的学生在操场上跑步",
    "蓝天白云下的海边灯塔",
    "老人在公园里打太极拳",
    "一只白色的猫蜷缩在沙发上",
    "雪地里的红色小木屋",
    "超市货架上摆满了水果",
    "夕阳下骑自行车的女孩",
    "一盘红烧肉和一碗米饭",
    "山间的瀑布和绿色的树林",
    "机场候机厅里拖着行李的旅客",
    "孩子们在教室里举手回答问题",
    "湖面上划船的一对情侣",
    "街边小摊上的烤串",
    "穿婚纱的新娘和新郎",
    "一辆公交车停在车站",
    "沙漠中行走的骆驼队",
    "桌上的生日蛋糕插着蜡烛",
    "下雨天撑着黄色雨伞的人",
    "足球比赛中射门的球员",
    "花园里盛开的红玫瑰",
    "厨房里正在包饺子的奶奶",
    "长城上的游客",
    "书架上整齐排列的书",
    "一只鹦鹉站在树枝上",
    "黑白色的斑马在草原上",
    "早晨的豆浆和油条",
    "办公室里开会的同事们",
    "a photo of a dog",
)


def _synthetic_images(count: int, resolution: int, seed: int = 101) -> np.ndarray:
    """Colour blocks with hard edges over a gradient plus noise: another kind of picture than the parity set."""
    from retrieval.manifest import CNCLIP_MEAN, CNCLIP_STD

    rng = np.random.default_rng(seed)
    ramp = np.linspace(0.0, 1.0, resolution, dtype=np.float32)
    out = np.empty((count, 3, resolution, resolution), dtype=np.float32)
    for i in range(count):
        base = (
            rng.random((3, 1, 1), dtype=np.float32) * ramp[None, :, None]
            + rng.random((3, 1, 1), dtype=np.float32) * ramp[None, None, :]
        )
        picture = base / 2
        for _ in range(rng.integers(2, 6)):
            y, x = rng.integers(0, resolution, 2)
            h, w = rng.integers(resolution // 8, resolution // 2, 2)
            picture[:, y : y + h, x : x + w] = rng.random((3, 1, 1), dtype=np.float32)
        picture += rng.normal(0, 0.03, picture.shape).astype(np.float32)
        out[i] = np.clip(picture, 0, 1)
    mean = np.asarray(CNCLIP_MEAN, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(CNCLIP_STD, dtype=np.float32).reshape(1, 3, 1, 1)
    return (out - mean) / std


def calibration_images(folder: Path | None, resolution: int) -> tuple[np.ndarray, str]:
    """Up to `MAX_IMAGES` pictures, preprocessed as the service does; and where they came from, in words."""
    if folder is None:
        return _synthetic_images(MAX_IMAGES, resolution), f"{MAX_IMAGES} synthetic pictures (no --calibration-images)"
    from retrieval.errors import InvalidImage
    from retrieval.preprocess import preprocess_image

    if not folder.is_dir():
        raise InvalidInput(f"--calibration-images {folder} is not a directory")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    step = max(1, len(files) // MAX_IMAGES)  # spread over the folder, deterministically
    pictures, bad = [], 0
    for path in files[::step][:MAX_IMAGES]:
        try:
            pictures.append(preprocess_image(path.read_bytes(), resolution))
        except (InvalidImage, OSError):
            bad += 1
    if len(pictures) < 8:
        raise InvalidInput(f"--calibration-images {folder}: {len(pictures)} readable pictures; at least 8 are needed")
    skipped = f", {bad} unreadable skipped" if bad else ""
    return np.stack(pictures).astype(np.float32), f"{len(pictures)} pictures from {folder}{skipped}"


def calibration_texts(file: Path | None, length: int) -> tuple[np.ndarray, str]:
    """Token ids of the calibration texts at `length` tokens; and where they came from."""
    from retrieval.tokenizer import tokenize

    if file is None:
        return tokenize(list(CALIBRATION_CAPTIONS), length), f"{len(CALIBRATION_CAPTIONS)} built-in captions"
    try:
        lines = [line.strip() for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read --calibration-texts {file}: {exc}") from exc
    if len(lines) < 8:
        raise InvalidInput(f"--calibration-texts {file}: {len(lines)} texts; at least 8 are needed")
    step = max(1, len(lines) // MAX_TEXTS)
    chosen = lines[::step][:MAX_TEXTS]
    return tokenize(chosen, length), f"{len(chosen)} texts from {file}"


def _items(inputs: np.ndarray, bucket: int) -> list[np.ndarray]:
    """Bucket-sized chunks (the graph's fixed batch), the last one padded with its first rows."""
    chunks = []
    for start in range(0, len(inputs), bucket):
        chunk = inputs[start : start + bucket]
        if len(chunk) < bucket:
            chunk = np.concatenate([chunk, inputs[: bucket - len(chunk)]])
        chunks.append(np.ascontiguousarray(chunk))
    return chunks


def to_int8_qdq(model: onnx.ModelProto, inputs: np.ndarray, keep: list[str]) -> onnx.ModelProto:
    """NNCF's post-training quantization of a fixed-batch fp32 graph; `keep`: MatMul nodes left float."""
    # NNCF sends usage telemetry unless told it runs in CI; nothing here may talk to the network.
    os.environ.setdefault("NNCF_CI", "1")
    import nncf

    name = model.graph.input[0].name
    bucket = model.graph.input[0].type.tensor_type.shape.dim[0].dim_value or 1
    items = [{name: chunk} for chunk in _items(inputs, bucket)]
    transformer = any(node.op_type == "Softmax" for node in model.graph.node)
    logging.getLogger("nncf").setLevel(logging.ERROR)
    try:
        return nncf.quantize(
            model,
            nncf.Dataset(items),
            subset_size=len(items),
            model_type=nncf.ModelType.TRANSFORMER if transformer else None,
            ignored_scope=nncf.IgnoredScope(names=keep, validate=False),
        )
    except (RuntimeError, ValueError, nncf.errors.ValidationError) as exc:  # type: ignore[attr-defined]
        raise ModelError(f"NNCF int8 quantization failed: {str(exc).splitlines()[0]}") from exc


class Calibration:
    """The calibration inputs of a conversion, read once and cut per text length."""

    def __init__(self, image_folder: Path | None = None, text_file: Path | None = None) -> None:
        self.image_folder, self.text_file = image_folder, text_file
        self._cache: dict[tuple[str, int], np.ndarray] = {}
        self.described: dict[str, str] = {}

    def inputs(self, tower: str, size: int) -> np.ndarray:
        """Images at `size` pixels, or texts at `size` tokens."""
        if (tower, size) not in self._cache:
            if tower == "image":
                self._cache[tower, size], self.described["image"] = calibration_images(self.image_folder, size)
            else:
                self._cache[tower, size], self.described["text"] = calibration_texts(self.text_file, size)
        return self._cache[tower, size]
