"""The parity gate: PyTorch vs every converted graph on the same inputs.

Images are smooth random pictures (bicubic-upsampled colour grids, cn_clip-normalised) and texts
are real Chinese sentences through the project's cn_clip-identical tokenizer. Each graph is run at
its own bucket size over all samples; the row-wise cosine against PyTorch must reach the precision's
threshold (fp32 ≥ 0.99999, fp16 ≥ 0.999). int8 has no hard threshold: its cosine and the top-10
neighbour overlap of text→image search on the sample gallery are reported.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from retrieval.errors import ModelError
from retrieval.toolchain.convert.export import tower_module
from retrieval.toolchain.convert.model import CLIP

# The parity set and the comparisons live in the runtime's quality gate (no torch there); the
# converter imports them, and its callers keep importing them from here.
from retrieval.toolchain.gate import PARITY_SENTENCES as PARITY_SENTENCES
from retrieval.toolchain.gate import cosines as cosines
from retrieval.toolchain.gate import parity_images
from retrieval.toolchain.gate import run_in_buckets as run_in_buckets
from retrieval.toolchain.gate import topk_overlap as topk_overlap

THRESHOLDS = {"fp32": 0.99999, "fp16": 0.999}


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
    """`count` smooth random pictures, preprocessed like cn_clip's transform: float32 [n, 3, R, R].
    The quality gate's parity images (retrieval/toolchain/gate.py), so the converter and the gate use one set."""
    return parity_images(count, resolution, seed)


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
