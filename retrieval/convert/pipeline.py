"""`cnclip convert`: a `CLIP` → a model directory of fixed-shape graphs, checked against PyTorch.

For each tower and bucket: export (fixed batch) → simplify → fp32 / fp16 / int8 variants. The
bucket graphs of one tower and precision share one weight file. Then every saved graph is run
against PyTorch (the parity gate), and only when that passes is `manifest.json` written — so a
directory with a manifest is always a checked one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from retrieval.convert import parity
from retrieval.convert.export import INPUT_NAMES, OPSET, OUTPUT_NAMES, RAW_OUTPUT_NAMES, TOWERS, export_tower
from retrieval.convert.model import CLIP, CONTEXT_LENGTH
from retrieval.convert.quantize import append_l2_normalize, to_fp16, to_int8
from retrieval.convert.report import ConvertReport
from retrieval.convert.simplify import op_counts, simplify_graph
from retrieval.errors import ModelError
from retrieval.graph_store import save_sharing_weights
from retrieval.manifest import MANIFEST_NAME, PRECISIONS, ModelManifest, TowerSpec

log = logging.getLogger(__name__)
IMAGE_SAMPLES = 48  # the parity gallery; also enough to fill the largest usual bucket (32)


def _variant(precision: str, model: onnx.ModelProto, tower: str) -> onnx.ModelProto:
    """The `precision` graph of a simplified fp32 tower, with the float32 normalisation appended."""
    if precision == "fp32":
        variant = model
    elif precision == "fp16":
        variant = to_fp16(model)
    else:
        variant = to_int8(model)
    return append_l2_normalize(variant, RAW_OUTPUT_NAMES[tower], OUTPUT_NAMES[tower])


def graph_name(tower: str, precision: str, bucket: int) -> str:
    return f"{tower}.{precision}.b{bucket}.onnx"


def write_graphs(
    model: CLIP,
    out: Path,
    buckets: Sequence[int],
    precisions: Sequence[str],
    report: ConvertReport,
    progress: Callable[[str], None] = lambda _msg: None,
) -> tuple[dict[str, dict[str, dict[int, str]]], list[str]]:
    """Export, simplify and save every graph; returns (tower -> precision -> bucket -> file, data files)."""
    graphs: dict[str, dict[str, dict[int, str]]] = {}
    data_files: list[str] = []
    methods = set()
    for tower in TOWERS:
        simplified: dict[int, onnx.ModelProto] = {}
        for bucket in buckets:
            progress(f"export {tower} b{bucket}")
            raw = export_tower(model, tower, bucket)
            progress(f"simplify {tower} b{bucket}")
            simplified[bucket], method = simplify_graph(raw)
            methods.add(method)
            if bucket == buckets[0]:
                report.ops[tower] = {"bucket": bucket, "before": op_counts(raw), "after": op_counts(simplified[bucket])}
            del raw
        # fp32 last: saving moves its weights out of the protos that the other variants are derived from.
        for precision in sorted(precisions, key=lambda p: p == "fp32"):
            progress(f"{precision} {tower}")
            variants = {graph_name(tower, precision, b): _variant(precision, g, tower) for b, g in simplified.items()}
            report.final_ops.setdefault(tower, {})[precision] = op_counts(next(iter(variants.values())))
            data_name = f"{tower}.{precision}.data"
            save_sharing_weights(variants, out, data_name)
            data_files.append(data_name)
            graphs.setdefault(tower, {})[precision] = {b: graph_name(tower, precision, b) for b in simplified}
    report.simplifier = "+".join(sorted(methods))
    return graphs, data_files


def check_parity(
    model: CLIP,
    out: Path,
    graphs: dict[str, dict[str, dict[int, str]]],
    report: ConvertReport,
    progress: Callable[[str], None] = lambda _msg: None,
) -> list[parity.TowerParity]:
    """Run every saved graph against PyTorch; fills the report; returns the per tower/precision results."""
    inputs = {
        "image": parity.sample_images(IMAGE_SAMPLES, model.image_resolution),
        "text": parity.sample_texts(),
    }
    reference = {tower: parity.torch_features(model, tower, inputs[tower]) for tower in TOWERS}
    first_bucket: dict[str, dict[str, np.ndarray]] = {}
    results = []
    for tower in TOWERS:
        for precision, files in sorted(graphs[tower].items(), key=lambda kv: PRECISIONS.index(kv[0])):
            progress(f"parity {tower} {precision}")
            per_bucket = {b: parity.onnx_features(out / f, inputs[tower], b) for b, f in sorted(files.items())}
            first_bucket.setdefault(precision, {})[tower] = per_bucket[min(per_bucket)]
            results.append(parity.tower_parity(tower, precision, per_bucket, reference[tower]))
    for precision, feats in first_bucket.items():
        if precision != "fp32" and len(feats) == 2:
            report.top10_overlap[precision] = parity.topk_overlap(
                reference["text"], reference["image"], feats["text"], feats["image"]
            )
    report.parity = [r.to_json() for r in results]
    return results


def convert_model(
    model: CLIP,
    out: Path,
    arch: str,
    buckets: Sequence[int] = (1, 4, 8, 16, 32),
    precisions: Sequence[str] = ("fp32", "fp16", "int8"),
    name: str | None = None,
    source: dict[str, Any] | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> tuple[ModelManifest, ConvertReport]:
    """Write a complete, parity-checked model directory for `model` into `out`."""
    started = time.perf_counter()
    buckets = sorted(set(buckets))
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown or not precisions:
        raise ModelError(f"unknown precision(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(PRECISIONS)}")
    if not buckets or buckets[0] < 1:
        raise ModelError("buckets must be positive batch sizes, e.g. 1,4,8,16,32")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_NAME).unlink(missing_ok=True)  # a half-written directory must never look loadable
    model = model.float().eval()
    report = ConvertReport(arch=arch, opset=OPSET)
    graphs, data_files = write_graphs(model, out, buckets, precisions, report, progress)
    results = check_parity(model, out, graphs, report, progress)
    for file in [*(f for t in graphs.values() for p in t.values() for f in p.values()), *data_files]:
        report.files[file] = (out / file).stat().st_size
    report.seconds = time.perf_counter() - started
    report.save(out)
    parity.enforce(results)  # after saving the report, so a failure can be inspected
    manifest = ModelManifest(
        name=name or f"cnclip-{arch.lower()}",
        arch=arch,
        embed_dim=model.embed_dim,
        image_size=model.image_resolution,
        context_length=CONTEXT_LENGTH,
        logit_scale=round(float(model.logit_scale.detach().exp()), 6),
        towers={tower: TowerSpec(INPUT_NAMES[tower], OUTPUT_NAMES[tower], graphs[tower]) for tower in TOWERS},
        extra={
            "source": source or {},
            "config": model.config,
            "opset": OPSET,
            "converter": "cnclip convert",
            "parity": {f"{r.tower}/{r.precision}": round(r.min_cosine, 7) for r in results},
        },
    )
    return manifest.save(out, data_files=data_files), report
