"""`cnclip convert --from-cnclip-onnx PREFIX`: wrap graphs made by Chinese-CLIP's own exporter.

`cn_clip/deploy/pytorch_to_onnx.py` writes `PREFIX.img.fp32.onnx`, `PREFIX.img.fp16.onnx`
(+ `.extra_file` external data), `PREFIX.txt.fp32.onnx`, `PREFIX.txt.fp16.onnx` (+ `.extra_file`):
batch 1, outputs `unnorm_image_features` / `unnorm_text_features`, fp16 ones with float32 inputs and
outputs. Each found graph becomes a model-directory graph: the batch dimension is set to each bucket
and the graph simplified at that shape (which folds the per-layer `Mod` the seed article found);
the output is L2-normalised in float32 and renamed `image_features` / `text_features`. A bucket
whose graph does not reproduce the batch-1 original row by row is dropped; if none but 1 survives,
the tower is bucket-1 only and the report says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, InvalidGraph, RuntimeException

from retrieval.errors import ModelError
from retrieval.graph_store import save_sharing_weights
from retrieval.manifest import MANIFEST_NAME, ModelManifest, TowerSpec
from retrieval.toolchain.convert import parity
from retrieval.toolchain.convert.export import INPUT_NAMES, OUTPUT_NAMES, RAW_OUTPUT_NAMES, TOWERS
from retrieval.toolchain.convert.quantize import append_l2_normalize
from retrieval.toolchain.convert.report import ConvertReport
from retrieval.toolchain.convert.simplify import op_counts, simplify_graph

log = logging.getLogger(__name__)
SUFFIX = {"image": "img", "text": "txt"}
# Batch-b graphs must reproduce the batch-1 original: same graph, same precision, only batching differs.
BATCH_COSINE = {"fp32": 0.99999, "fp16": 0.999}


def find_graphs(prefix: str | Path) -> dict[str, dict[str, Path]]:
    """tower -> precision -> path of the exporter's files that exist for `prefix`."""
    found: dict[str, dict[str, Path]] = {}
    for tower in TOWERS:
        for precision in ("fp32", "fp16"):
            path = Path(f"{prefix}.{SUFFIX[tower]}.{precision}.onnx")
            if path.is_file():
                found.setdefault(tower, {})[precision] = path
    missing = [t for t in TOWERS if t not in found]
    if missing:
        expected = ", ".join(f"{prefix}.{SUFFIX[t]}.{{fp16,fp32}}.onnx" for t in missing)
        raise ModelError(f"no Chinese-CLIP ONNX graph for the {' and '.join(missing)} tower: expected {expected}")
    return found


def _load(path: Path) -> onnx.ModelProto:
    try:
        model = onnx.load(str(path))  # resolves the `.extra_file` beside the graph
    except (OSError, onnx.checker.ValidationError, ValueError) as exc:
        raise ModelError(f"cannot read {path} (and its .extra_file, if any): {exc}") from exc
    inputs = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    outputs = [o.name for o in model.graph.output]
    tower = "image" if inputs == ["image"] else "text" if inputs == ["text"] else None
    if tower is None or outputs != [RAW_OUTPUT_NAMES[tower]]:
        raise ModelError(
            f"{path} is not a Chinese-CLIP exporter graph: inputs {inputs}, outputs {outputs} "
            "(expected image→unnorm_image_features or text→unnorm_text_features)"
        )
    return model


def _with_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in (*fixed.graph.input, *fixed.graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_value = batch
    del fixed.graph.value_info[:]
    return fixed


def _shape(model: onnx.ModelProto, name: str) -> list[int]:
    value = next(v for v in (*model.graph.input, *model.graph.output) if v.name == name)
    return [d.dim_value for d in value.type.tensor_type.shape.dim]


def _try_bucket(
    original: onnx.ModelProto,
    tower: str,
    precision: str,
    bucket: int,
    samples: np.ndarray,
    reference: np.ndarray,
    workdir: Path,
) -> tuple[onnx.ModelProto, str] | None:
    """The batch-`bucket` graph, simplified and normalised, if it reproduces the batch-1 original; else None."""
    check = workdir / f".check.{tower}.{precision}.b{bucket}.onnx"
    try:
        simplified, method = simplify_graph(_with_batch(original, bucket))
        candidate = append_l2_normalize(simplified, RAW_OUTPUT_NAMES[tower], OUTPUT_NAMES[tower])
        onnx.save_model(candidate, str(check))
        got = parity.onnx_features(check, samples, bucket)
    except (ModelError, ValueError, Fail, InvalidArgument, InvalidGraph, RuntimeException) as exc:
        log.info("%s %s batch %d not usable: %s", tower, precision, bucket, exc)
        return None
    finally:
        check.unlink(missing_ok=True)
    if float(parity.cosines(got, reference).min()) < BATCH_COSINE[precision]:
        return None
    return candidate, method


def _bucket_graphs(
    original: onnx.ModelProto,
    path: Path,
    tower: str,
    precision: str,
    buckets: Sequence[int],
    samples: Any,
    reference: Any,
    out: Path,
    report: ConvertReport,
    methods: set[str],
    progress: Callable[[str], None],
) -> tuple[dict[str, onnx.ModelProto], dict[int, str]]:
    """One graph per bucket that reproduces `reference` (file name -> graph, bucket -> file name);
    buckets whose graph fails are dropped with a note in `report` (bucket 1 must work)."""
    graphs: dict[str, onnx.ModelProto] = {}
    kept: dict[int, str] = {}
    dropped: list[int] = []
    for bucket in sorted(set(buckets) | {1}):
        progress(f"{tower} {precision} b{bucket}")
        attempt = _try_bucket(original, tower, precision, bucket, samples, reference, out)
        if attempt is None and bucket != 1:
            dropped.append(bucket)
            continue
        if attempt is None:
            raise ModelError(f"{path}: the simplified batch-1 graph does not reproduce the original")
        candidate, method = attempt
        methods.add(method)
        if bucket == 1 and tower not in report.ops:
            report.ops[tower] = {"bucket": 1, "before": op_counts(original), "after": op_counts(candidate)}
        file = f"{tower}.{precision}.b{bucket}.onnx"
        graphs[file] = candidate
        kept[bucket] = file
    if dropped and list(kept) == [1]:
        report.notes.append(
            f"{tower} {precision}: bucket 1 only — the exporter baked batch 1 into the graph's reshapes "
            f"(batch {', '.join(map(str, dropped))} cannot run); requests run one item at a time"
        )
    elif dropped:
        report.notes.append(f"{tower} {precision}: buckets {', '.join(map(str, dropped))} dropped (graph fails)")
    return graphs, kept


def wrap_cnclip_onnx(
    prefix: str | Path,
    out: Path,
    buckets: Sequence[int] = (1, 4, 8, 16, 32),
    name: str | None = None,
    arch: str = "cnclip-onnx",
    logit_scale: float = 100.0,
    progress: Callable[[str], None] = lambda _msg: None,
) -> tuple[ModelManifest, ConvertReport]:
    """Write a model directory from Chinese-CLIP exporter graphs at `prefix` (see module docstring)."""
    started = time.perf_counter()
    found = find_graphs(prefix)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    report = ConvertReport(arch=arch, opset=0)
    towers: dict[str, dict[str, dict[int, str]]] = {}
    data_files: list[str] = []
    image_size = embed_dim = 0
    context_length = 52
    methods: set[str] = set()
    for tower, paths in found.items():
        for precision, path in paths.items():
            original = _load(path)
            report.opset = max(report.opset, *(o.version for o in original.opset_import if o.domain in ("", "ai.onnx")))
            if tower == "image":
                image_size = _shape(original, "image")[-1]
            else:
                context_length = _shape(original, "text")[-1] or context_length
            samples = parity.sample_images(8, image_size) if tower == "image" else parity.sample_texts()[:8]
            try:
                reference = parity.onnx_features(path, samples, 1, basic=True)
            except (Fail, InvalidArgument, InvalidGraph, RuntimeException) as exc:
                raise ModelError(f"ONNX Runtime cannot run {path}: {exc}") from exc
            embed_dim = reference.shape[1]
            graphs, kept = _bucket_graphs(
                original, path, tower, precision, buckets, samples, reference, out, report, methods, progress
            )
            save_sharing_weights(graphs, out, f"{tower}.{precision}.data")
            data_files.append(f"{tower}.{precision}.data")
            towers.setdefault(tower, {})[precision] = kept
            report.final_ops.setdefault(tower, {})[precision] = op_counts(next(iter(graphs.values())))
    for file in [*(f for t in towers.values() for p in t.values() for f in p.values()), *data_files]:
        report.files[file] = (out / file).stat().st_size
    report.simplifier = "+".join(sorted(methods))
    report.seconds = time.perf_counter() - started
    report.save(out)
    manifest = ModelManifest(
        name=name or Path(prefix).name,
        arch=arch,
        embed_dim=int(embed_dim),
        image_size=int(image_size),
        context_length=context_length,
        logit_scale=logit_scale,
        towers={t: TowerSpec(INPUT_NAMES[t], OUTPUT_NAMES[t], towers[t]) for t in TOWERS},
        extra={"source": {"cnclip_onnx_prefix": str(prefix)}, "converter": "cnclip convert --from-cnclip-onnx"},
    )
    return manifest.save(out, data_files=data_files), report
