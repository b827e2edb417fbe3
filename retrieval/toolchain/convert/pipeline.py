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

from retrieval.errors import ModelError
from retrieval.graph_store import SharedWeightsFile
from retrieval.manifest import MANIFEST_NAME, PRECISIONS, ModelManifest, TowerSpec
from retrieval.text_lengths import parse_lengths
from retrieval.toolchain.convert import parity
from retrieval.toolchain.convert.engine_gate import gate_engines
from retrieval.toolchain.convert.export import INPUT_NAMES, OPSET, OUTPUT_NAMES, RAW_OUTPUT_NAMES, TOWERS, export_tower
from retrieval.toolchain.convert.model import CLIP, CONTEXT_LENGTH
from retrieval.toolchain.convert.openvino_int8 import Calibration, to_int8_qdq
from retrieval.toolchain.convert.quantize import append_l2_normalize, output_projections, to_fp16, to_int8
from retrieval.toolchain.convert.report import ConvertReport
from retrieval.toolchain.convert.simplify import op_counts, simplify_graph

log = logging.getLogger(__name__)
IMAGE_SAMPLES = 48  # the parity gallery; also enough to fill the largest usual bucket (32)
# Text length buckets made by default. Search queries are short: "穿红色裙子的女孩" is 10 tokens with
# [CLS] and [SEP], and 16 holds a query of up to 14 characters. 32 holds a zero-shot prompt around a
# label ("一张{}的照片" is 7 tokens) and most captions. 52 is cn_clip's full length, always made for
# longer texts. Each length costs a text session per batch bucket at start-up, so there are few.
DEFAULT_TEXT_LENGTHS = (16, 32, 52)


def _variant(
    precision: str, model: onnx.ModelProto, tower: str, calibration: Calibration | None = None, size: int = 0
) -> onnx.ModelProto:
    """The `precision` graph of a simplified fp32 tower, with the float32 normalisation appended.

    `int8-qdq` (NNCF, for OpenVINO) is calibrated on `calibration`'s inputs at `size` pixels/tokens."""
    if precision == "fp32":
        variant = model
    elif precision == "fp16":
        variant = to_fp16(model)
    elif precision == "int8-qdq":
        inputs = (calibration or Calibration()).inputs(tower, size)
        variant = to_int8_qdq(model, inputs, output_projections(model))
    else:
        variant = to_int8(model)
    return append_l2_normalize(variant, RAW_OUTPUT_NAMES[tower], OUTPUT_NAMES[tower])


def graph_name(tower: str, precision: str, bucket: int, length: int | None = None) -> str:
    """`text.int8.b8.onnx` at the full length; `text.int8.b8.l16.onnx` for a shorter length bucket."""
    suffix = f".l{length}" if length is not None else ""
    return f"{tower}.{precision}.b{bucket}{suffix}.onnx"


# A graph's shape: (batch bucket, text length bucket or None for the full input).
Shape = tuple[int, int | None]
# tower -> precision -> shape -> graph file
GraphFiles = dict[str, dict[str, dict[Shape, str]]]


def write_graphs(
    model: CLIP,
    out: Path,
    buckets: Sequence[int],
    precisions: Sequence[str],
    report: ConvertReport,
    progress: Callable[[str], None] = lambda _msg: None,
    text_lengths: Sequence[int] = (),
    calibration: Calibration | None = None,
) -> tuple[GraphFiles, list[str]]:
    """Export, simplify and save every graph; returns (tower -> precision -> shape -> file, data files).

    `text_lengths` are the text tower's shorter length buckets. One length's bucket graphs are in
    memory at a time; all graphs of a tower and precision share one weight file."""
    graphs: GraphFiles = {}
    data_files: list[str] = []
    methods: set[str] = set()
    for tower in TOWERS:
        lengths: list[int | None] = [None, *text_lengths] if tower == "text" else [None]
        files = {p: SharedWeightsFile(out, f"{tower}.{p}.data") for p in precisions}
        try:
            for length in lengths:
                shapes = [(bucket, length) for bucket in buckets]
                simplified = _export_simplified(model, tower, shapes, report, methods, progress)
                # fp32 last: saving moves its weights out of the protos the other variants are derived from.
                for precision in sorted(precisions, key=lambda p: p == "fp32"):
                    progress(f"{precision} {tower}" + (f" l{length}" if length else ""))
                    for shape, graph in simplified.items():
                        size = model.image_resolution if tower == "image" else length or CONTEXT_LENGTH
                        variant = _variant(precision, graph, tower, calibration, size)
                        if length is None and shape == shapes[0]:
                            report.final_ops.setdefault(tower, {})[precision] = op_counts(variant)
                        name = graph_name(tower, precision, *shape)
                        files[precision].add(name, variant)
                        graphs.setdefault(tower, {}).setdefault(precision, {})[shape] = name
                del simplified
        finally:
            for shared in files.values():
                shared.close()
        data_files += [shared.data_name for shared in files.values()]
    report.simplifier = "+".join(sorted(methods))
    return graphs, data_files


def _export_simplified(
    model: CLIP,
    tower: str,
    shapes: Sequence[Shape],
    report: ConvertReport,
    methods: set[str],
    progress: Callable[[str], None],
) -> dict[Shape, onnx.ModelProto]:
    simplified: dict[Shape, onnx.ModelProto] = {}
    for bucket, length in shapes:
        label = f"{tower} b{bucket}" + (f" l{length}" if length else "")
        progress(f"export {label}")
        raw = export_tower(model, tower, bucket, length=length or CONTEXT_LENGTH)
        progress(f"simplify {label}")
        simplified[(bucket, length)], method = simplify_graph(raw)
        methods.add(method)
        if tower not in report.ops:
            report.ops[tower] = {
                "bucket": bucket,
                "before": op_counts(raw),
                "after": op_counts(simplified[(bucket, length)]),
            }
        del raw
    return simplified


def check_parity(
    model: CLIP,
    out: Path,
    graphs: GraphFiles,
    report: ConvertReport,
    progress: Callable[[str], None] = lambda _msg: None,
) -> list[parity.TowerParity]:
    """Run every saved graph against PyTorch; fills the report; returns the per tower/precision results.

    A text length bucket L runs the parity sentences cut to L tokens, against PyTorch on the same
    tokens padded to the full 52: a row must not depend on the length bucket it runs in."""
    images = parity.sample_images(IMAGE_SAMPLES, model.image_resolution)
    first_bucket: dict[str, dict[str, np.ndarray]] = {}
    reference: dict[str, np.ndarray] = {"image": parity.torch_features(model, "image", images)}
    results = []
    for tower in TOWERS:
        for precision, files in sorted(graphs[tower].items(), key=lambda kv: PRECISIONS.index(kv[0])):
            for length in sorted({length for _, length in files}, key=lambda n: n or CONTEXT_LENGTH):
                progress(f"parity {tower} {precision}" + (f" l{length}" if length else ""))
                if tower == "image":
                    inputs, key = images, "image"
                else:
                    inputs, key = parity.sample_texts(length or CONTEXT_LENGTH), f"text{length}"
                    if key not in reference:
                        reference[key] = parity.torch_features(model, "text", _padded(inputs))
                per_bucket = {
                    b: parity.onnx_features(out / f, inputs, b)
                    for (b, n), f in sorted(files.items(), key=lambda kv: kv[0][0])
                    if n == length
                }
                if length is None:
                    first_bucket.setdefault(precision, {})[tower] = per_bucket[min(per_bucket)]
                results.append(parity.tower_parity(tower, precision, per_bucket, reference[key], length))
    for precision, feats in first_bucket.items():
        if precision != "fp32" and len(feats) == 2:
            report.top10_overlap[precision] = parity.topk_overlap(
                reference["textNone"], reference["image"], feats["text"], feats["image"]
            )
    report.parity = [r.to_json() for r in results]
    return results


def _padded(ids: np.ndarray) -> np.ndarray:
    """Token ids zero-padded to the full context length, as the tokenizer gives them."""
    return np.pad(ids, ((0, 0), (0, CONTEXT_LENGTH - ids.shape[1])))


def _tower_spec(tower: str, files: dict[str, dict[Shape, str]]) -> TowerSpec:
    full = {p: {b: f for (b, n), f in shapes.items() if n is None} for p, shapes in files.items()}
    short: dict[str, dict[int, dict[int, str]]] = {}
    for precision, shapes in files.items():
        for (bucket, length), file in shapes.items():
            if length is not None:
                short.setdefault(precision, {}).setdefault(length, {})[bucket] = file
    return TowerSpec(INPUT_NAMES[tower], OUTPUT_NAMES[tower], full, short)


def convert_model(
    model: CLIP,
    out: Path,
    arch: str,
    buckets: Sequence[int] = (1, 4, 8, 16, 32),
    precisions: Sequence[str] = ("fp32", "fp16", "int8"),
    name: str | None = None,
    source: dict[str, Any] | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
    text_lengths: Sequence[int] = DEFAULT_TEXT_LENGTHS,
    calibration: Calibration | None = None,
) -> tuple[ModelManifest, ConvertReport]:
    """Write a complete, parity-checked model directory for `model` into `out`.

    `text_lengths`: the text graphs' sequence lengths (the full 52 is always made)."""
    started = time.perf_counter()
    buckets = sorted(set(buckets))
    short_lengths = parse_lengths(text_lengths, CONTEXT_LENGTH)[:-1]
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
    calibration = calibration if calibration is not None else Calibration()
    graphs, data_files = write_graphs(model, out, buckets, precisions, report, progress, short_lengths, calibration)
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
        towers={tower: _tower_spec(tower, graphs[tower]) for tower in TOWERS},
        extra={
            "source": source or {},
            "config": model.config,
            "opset": OPSET,
            "converter": "cnclip convert",
            "parity": {r.key: round(r.min_cosine, 7) for r in results},
        },
    )
    saved = manifest.save(out, data_files=data_files)
    if calibration is not None and calibration.described:
        report.notes += [f"int8-qdq calibrated on {what}" for what in calibration.described.values()]
    saved = gate_engines(saved, out, report, progress)
    report.save(out)
    return saved, report
