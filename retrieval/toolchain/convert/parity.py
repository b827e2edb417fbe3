"""The parity gate: PyTorch vs every converted graph on the same inputs.

Images are smooth random pictures (bicubic-upsampled colour grids, cn_clip-normalised) and texts
are real Chinese sentences through the project's cn_clip-identical tokenizer. Each graph is run at
its own bucket size over all samples; the row-wise cosine against PyTorch must reach the precision's
threshold (fp32 ≥ 0.99999, fp16 ≥ 0.999). int8 has no hard threshold: its cosine and the top-10
neighbour overlap of text→image search on the sample gallery are reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from retrieval.errors import ModelError
from retrieval.manifest import CNCLIP_MEAN, CNCLIP_STD
from retrieval.toolchain.convert.export import tower_module
from retrieval.toolchain.convert.model import CLIP

THRESHOLDS = {"fp32": 0.99999, "fp16": 0.999}

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


@dataclass
class TowerParity:
    tower: str
    precision: str
    buckets: list[int]
    samples: int
    min_cosine: float
    mean_cosine: float
    threshold: float | None
    passed: bool
    length: int | None = None  # text length bucket; None = the full input

    @property
    def key(self) -> str:
        """ "text/int8" or, for a length bucket, "text/int8/l16"."""
        return f"{self.tower}/{self.precision}" + (f"/l{self.length}" if self.length else "")

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def sample_images(count: int, resolution: int, seed: int = 0) -> np.ndarray:
    """`count` smooth random pictures, preprocessed like cn_clip's transform: float32 [n, 3, R, R]."""
    generator = torch.Generator().manual_seed(seed)
    grid = torch.rand(count, 3, 6, 6, generator=generator)
    pixels = F.interpolate(grid, size=(resolution, resolution), mode="bicubic", align_corners=False).clamp(0, 1)
    mean = torch.tensor(CNCLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CNCLIP_STD).view(1, 3, 1, 1)
    return ((pixels - mean) / std).numpy().astype(np.float32)


def sample_texts(length: int = 52) -> np.ndarray:
    """The parity sentences as cn_clip token ids, int64 [n, length] (cut to `length` tokens)."""
    from retrieval.tokenizer import tokenize

    return tokenize(list(PARITY_SENTENCES), length)


def torch_features(model: CLIP, tower: str, inputs: np.ndarray, batch: int = 8) -> np.ndarray:
    """L2-normalised features from the PyTorch model (the reference)."""
    module = tower_module(model, tower)
    out = []
    with torch.no_grad():
        for start in range(0, len(inputs), batch):
            out.append(F.normalize(module(torch.from_numpy(inputs[start : start + batch])), dim=-1).numpy())
    return np.concatenate(out)


def onnx_features(graph: Path, inputs: np.ndarray, bucket: int, threads: int = 0, basic: bool = False) -> np.ndarray:
    """Features from one fixed-batch graph: inputs are run in bucket-sized chunks, the last one padded.

    `basic` limits ONNX Runtime to its basic graph optimisations, for graphs it is not ours to vouch
    for (its fp16 layer-norm fusion fails on some unsimplified third-party graphs).
    """
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # a graph that cannot run at this batch is an answer, not log noise
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    if basic:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return run_in_buckets(lambda chunk: session.run(None, {name: chunk})[0], inputs, bucket).astype(np.float32)


def run_in_buckets(run: Callable[[np.ndarray], np.ndarray], inputs: np.ndarray, bucket: int) -> np.ndarray:
    """`run` over `inputs` in chunks of exactly `bucket` rows, the last padded with copies of its
    last row; the padding rows' outputs are dropped."""
    out = []
    for start in range(0, len(inputs), bucket):
        chunk = inputs[start : start + bucket]
        real = len(chunk)
        if real < bucket:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], bucket - real, axis=0)])
        out.append(run(chunk)[:real])
    return np.concatenate(out)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def topk_overlap(
    ref_queries: np.ndarray, ref_gallery: np.ndarray, queries: np.ndarray, gallery: np.ndarray, k: int = 10
) -> float:
    """Mean fraction of each query's top-k gallery neighbours that two feature sets agree on."""
    k = min(k, len(ref_gallery))
    ref_top = np.argsort(-(ref_queries @ ref_gallery.T), axis=1)[:, :k]
    top = np.argsort(-(queries @ gallery.T), axis=1)[:, :k]
    return float(np.mean([len(set(r) & set(t)) / k for r, t in zip(ref_top, top, strict=True)]))


def tower_parity(
    tower: str, precision: str, per_bucket: dict[int, np.ndarray], reference: np.ndarray, length: int | None = None
) -> TowerParity:
    """Compare each bucket's features with the reference; apply the precision's threshold."""
    cos = np.concatenate([cosines(features, reference) for features in per_bucket.values()])
    threshold = THRESHOLDS.get(precision)
    min_cos = float(cos.min())
    return TowerParity(
        tower=tower,
        precision=precision,
        buckets=sorted(per_bucket),
        samples=len(reference),
        min_cosine=min_cos,
        mean_cosine=float(cos.mean()),
        threshold=threshold,
        passed=threshold is None or min_cos >= threshold,
        length=length,
    )


def enforce(results: list[TowerParity]) -> None:
    """Raise a clear error when any fp32/fp16 graph misses its threshold."""
    failed = [r for r in results if not r.passed]
    if failed:
        lines = [
            f"{r.tower} {r.precision}{f' length {r.length}' if r.length else ''}: "
            f"min cosine {r.min_cosine:.6f} < {r.threshold} (buckets {r.buckets})"
            for r in failed
        ]
        raise ModelError(
            "parity gate failed — the ONNX graphs do not reproduce PyTorch:\n  "
            + "\n  ".join(lines)
            + "\nThe model directory was not completed. Check the architecture (--arch/--config) matches the checkpoint."
        )
