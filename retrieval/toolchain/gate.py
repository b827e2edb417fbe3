"""The quality gate for every engine × run precision × tower: against fp32, on the parity set.

A lower precision (int8, bf16, fp16) or another engine is only used for a tower when, on the same
inputs, its vectors stay close to the fp32 graph's: the row-wise cosine of every sample at least
`MIN_COSINE`, and search answers that agree — the mean top-10 overlap of text→image search over
the parity gallery at least `MIN_TOP10` (the tower under test is swapped in, the other tower stays
fp32, so each tower is judged on its own). Every shape (batch bucket, text length) of the tower is
checked; the tower's result is its worst shape.

The reference is the model directory's fp32 graph of the same shape on ONNX Runtime's CPU provider:
`cnclip convert` already checked those against PyTorch (cosine ≥ 0.99999), so the gate needs no
torch and runs wherever the service runs (`cnclip tune` runs it on the machine being tuned, since
int8 and bf16 kernels differ between CPUs). `cnclip convert` runs it too and records the results
in the manifest (`extra.gate`); the runtime never picks what a record says failed (it reads the
record with retrieval/recorded_gate.py, apart from this module: the runtime core never imports the
toolchain).

The parity set is the converter's (retrieval/toolchain/convert/parity.py uses these functions): 48 smooth
random pictures and 24 Chinese sentences. It is *not* the int8 calibration set (the demo gallery
photos and captions, retrieval/toolchain/convert/openvino_int8.py), so a calibrated graph is judged on
inputs it was not fitted to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from retrieval.backends import Backend, SessionConfig, engine_errors
from retrieval.errors import ModelError
from retrieval.manifest import CNCLIP_MEAN, CNCLIP_STD, ModelManifest
from retrieval.tokenizer import tokenize

MIN_COSINE = 0.999
MIN_TOP10 = 0.98
# Two gallery items whose fp32 scores for a query differ by less than this are a tie: which of them a
# search returns tenth says nothing about quality. On the parity set the 10th and 11th fp32 scores of a
# random-weight ViT-B-16 differ by a median of 0.0004, as much as int8 moves a score, so the strict
# overlap there counts such swaps as disagreements (92-98 % at cosine >= 0.9998). CLIP cosines of a
# relevant and an unrelated picture differ by tenths, not thousandths.
TIE_TOLERANCE = 1e-3
IMAGE_SAMPLES = 48
TOP_K = 10

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
    mean = np.asarray(CNCLIP_MEAN, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(CNCLIP_STD, dtype=np.float32).reshape(1, 3, 1, 1)
    return (out - mean) / std


def parity_texts(length: int = 52) -> np.ndarray:
    """The parity sentences as cn_clip token ids, int64 [n, length] (cut to `length` tokens)."""
    return tokenize(list(PARITY_SENTENCES), length)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def topk_overlap(
    ref_queries: np.ndarray, ref_gallery: np.ndarray, queries: np.ndarray, gallery: np.ndarray, k: int = TOP_K
) -> float:
    """Mean fraction of each query's top-k gallery neighbours that two feature sets agree on."""
    k = min(k, len(ref_gallery))
    ref_top = np.argsort(-(ref_queries @ ref_gallery.T), axis=1)[:, :k]
    top = np.argsort(-(queries @ gallery.T), axis=1)[:, :k]
    return float(np.mean([len(set(r) & set(t)) / k for r, t in zip(ref_top, top, strict=True)]))


def topk_agreement(
    ref_queries: np.ndarray,
    ref_gallery: np.ndarray,
    queries: np.ndarray,
    gallery: np.ndarray,
    k: int = TOP_K,
    tie: float = TIE_TOLERANCE,
) -> float:
    """`topk_overlap` up to ties: a neighbour the candidate returns in its top k agrees with the
    reference when the reference scores it within `tie` of the reference's own k-th score."""
    k = min(k, len(ref_gallery))
    reference = ref_queries @ ref_gallery.T
    kth = -np.sort(-reference, axis=1)[:, k - 1 : k]
    top = np.argsort(-(queries @ gallery.T), axis=1)[:, :k]
    return float(np.mean(np.take_along_axis(reference, top, axis=1) >= kth - tie))


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


@dataclass(frozen=True)
class GateResult:
    """One backend × run precision × tower, judged over all of the tower's shapes (its worst)."""

    backend: str
    precision: str
    tower: str
    min_cosine: float
    top10_overlap: float  # strict: the same items
    shapes: int
    passed: bool
    reason: str = ""
    top10_agreement: float = 0.0  # up to ties (TIE_TOLERANCE): what the gate judges

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.backend, self.precision, self.tower)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["min_cosine"] = round(self.min_cosine, 7)
        out["top10_overlap"] = round(self.top10_overlap, 4)
        out["top10_agreement"] = round(self.top10_agreement, 4)
        return out

    def line(self) -> str:
        verdict = "passed" if self.passed else f"REFUSED ({self.reason})"
        return (
            f"{self.tower} on {self.backend} {self.precision}: min cosine {self.min_cosine:.5f}, "
            f"top-10 agreement {self.top10_agreement:.1%} (strict overlap {self.top10_overlap:.1%}) "
            f"over {self.shapes} shape(s): {verdict}"
        )


def judge(
    backend: str,
    precision: str,
    tower: str,
    cosine_by_shape: Sequence[float],
    top10_by_shape: Sequence[float],
    agreement_by_shape: Sequence[float] | None = None,
) -> GateResult:
    """Apply the thresholds to a tower's per-shape figures: the cosine, and the top-10 agreement up
    to ties (the strict overlap when no agreement is given)."""
    min_cos, top10 = float(min(cosine_by_shape)), float(min(top10_by_shape))
    agreement = float(min(agreement_by_shape)) if agreement_by_shape is not None else top10
    reasons = []
    if not min_cos >= MIN_COSINE:  # also refuses NaN
        reasons.append(f"cosine {min_cos:.5f} < {MIN_COSINE}")
    if not agreement >= MIN_TOP10:
        reasons.append(f"top-10 agreement {agreement:.1%} < {MIN_TOP10:.0%}")
    passed = not reasons
    return GateResult(
        backend, precision, tower, min_cos, top10, len(cosine_by_shape), passed, "; ".join(reasons), agreement
    )


def gate_record(results: Iterable[GateResult], machine: dict[str, Any]) -> dict[str, Any]:
    """The manifest's `extra.gate`: thresholds, the machine it ran on, each result."""
    return {
        "min_cosine": MIN_COSINE,
        "min_top10_overlap": MIN_TOP10,  # applied to the agreement up to ties
        "tie_tolerance": TIE_TOLERANCE,
        "machine": machine,
        "results": [r.to_json() for r in results],
    }


@dataclass(frozen=True)
class Candidate:
    """One way to run a tower: a backend on a device at a run precision, opening a graph variant."""

    backend: Backend
    device: str
    precision: str
    graph: str

    @property
    def label(self) -> str:
        return f"{self.backend.name} {self.device} {self.precision}"


def tower_shapes(manifest: ModelManifest, tower: str, graph: str) -> list[tuple[int, int | None]]:
    """Every (batch bucket, text length or None for the full one) the tower has in `graph`."""
    spec = manifest.towers[tower]
    lengths: list[int | None] = [None]
    if tower == "text":
        lengths += [n for n in manifest.text_lengths(graph) if n < manifest.context_length]
    return [(b, n) for n in lengths for b in spec.buckets(graph)]


def gate_inputs(manifest: ModelManifest, tower: str, length: int | None) -> np.ndarray:
    """The parity inputs of a tower at a text length (None: the full one)."""
    if tower == "image":
        return parity_images(IMAGE_SAMPLES, manifest.image_size)
    return parity_texts(length or manifest.context_length)


def candidate_features(
    manifest: ModelManifest, tower: str, candidate: Candidate, shape: tuple[int, int | None], cores: Sequence[int]
) -> np.ndarray:
    """The parity inputs run through one candidate's session of one shape."""
    bucket, length = shape
    spec = manifest.towers[tower]
    config = SessionConfig(
        provider=candidate.device,
        precision=candidate.graph,
        cores=list(cores),
        backend=candidate.backend.name,
        run_precision=candidate.precision,
    )
    path = manifest.graph_path(tower, candidate.graph, bucket, length)
    session = candidate.backend.open_session(path, config, spec.input_name, spec.output_name)
    return run_in_buckets(session.run, gate_inputs(manifest, tower, length), bucket).astype(np.float32)


def run_gate(
    manifest: ModelManifest, candidates: dict[str, list[Candidate]], cores: Sequence[int], reference: Candidate
) -> list[GateResult]:
    """Judge each tower's candidates against `reference` (ONNX Runtime's fp32 on the CPU).

    A candidate whose session cannot open or run is refused with the engine's message."""
    if any("fp32" not in manifest.towers[t].precisions() for t in candidates):
        raise ModelError("the quality gate compares against the fp32 graphs; this model directory has none")
    first = {t: min(manifest.towers[t].buckets("fp32")) for t in ("image", "text")}
    refs: dict[tuple[str, int | None], np.ndarray] = {}

    def ref(tower: str, length: int | None) -> np.ndarray:
        if (tower, length) not in refs:
            refs[tower, length] = candidate_features(manifest, tower, reference, (first[tower], length), cores)
        return refs[tower, length]

    results = []
    for tower, options in candidates.items():
        for candidate in options:
            cos, top10, agreement = [], [], []
            try:
                for shape in tower_shapes(manifest, tower, candidate.graph):
                    features = candidate_features(manifest, tower, candidate, shape, cores)
                    cos.append(float(cosines(features, ref(tower, shape[1])).min()))
                    if tower == "image":
                        texts = ref("text", None)
                        pair = (texts, ref("image", None), texts, features)
                    else:
                        images = ref("image", None)
                        pair = (ref("text", shape[1]), images, features, images)
                    top10.append(topk_overlap(*pair))
                    agreement.append(topk_agreement(*pair))
            except engine_errors() as exc:
                message = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                results.append(
                    GateResult(candidate.backend.name, candidate.precision, tower, 0.0, 0.0, 0, False, message)
                )
                continue
            results.append(judge(candidate.backend.name, candidate.precision, tower, cos, top10, agreement))
    return results
