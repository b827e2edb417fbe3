"""Write a Triton model repository from a converted model directory (`cnclip export-triton`).

    REPO/
      cnclip_text/         1/model.onnx + config.pbtxt   INT64 [-1, 52]        → text_features  FP32 [-1, d]
    cnclip_text_l16/     1/model.onnx + config.pbtxt   INT64 [-1, 16]        (one per shorter text length bucket)
      cnclip_image/        1/model.onnx + config.pbtxt   FP32  [-1, 3, R, R]   → image_features FP32 [-1, d]
      preprocess/          1/model.py   + config.pbtxt   BYTES [-1, 1] JPEG/PNG → image FP32 [-1, 3, R, R]
      cnclip_image_bytes/  1/           + config.pbtxt   ensemble: preprocess → cnclip_image

The model and tensor names are the ones our own `/v2` endpoint serves, so the remote encoder
(`CNCLIP_ENCODER=triton://…`) works against either (Triton's batching ensemble takes files as
`[n, 1]`, ours as `[n]`; the encoder reads the shape from the metadata).

Backends (records in backends.py, which says what each writes):
- `onnxruntime`: one batch-dynamic graph per tower (the bucket graphs with their batch dimension
  relaxed, checked numerically against the bucket graph), `max_batch_size` and Triton's
  `dynamic_batching` with our buckets as preferred sizes.
- `python`: the same batch-dynamic graphs and batching, run by a Python-backend model
  (`retrieval/toolchain/triton/onnx_model.py`, copied as `1/model.py`, with the provider registry
  `retrieval/backends/ort_providers.py` beside it) with ONNX Runtime: CPU, CUDA or CANN,
  whatever the onnxruntime in Triton's Python environment has. For a Triton without the onnxruntime
  backend (the `nvidia-pytriton` build the tests run, or an Ascend host where that backend has no
  CANN build). Float inputs are FP32 in the config and cast to the graph's type inside.
- `npu_ge` (Ascend ge-backend, the seed's deployment): the fixed-shape graph of one bucket with
  `static_model` — the seed's 2.6× step — so no dynamic batching (a static graph has one batch
  size; `max_batch_size: 0` and full shapes), plus `ge.aicoreNum` (core locking per stream) and
  `device_ids`. `instance_group.count > 1` gives the ge-backend's parallel streams.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import onnx

from retrieval.errors import InvalidInput, ModelError
from retrieval.manifest import ModelManifest
from retrieval.toolchain.triton.backends import TRITON_BACKENDS, TritonBackend, triton_backend
from retrieval.toolchain.triton.graphs import dynamic_batch_graph, load_graph, rename_io
from retrieval.triton_names import IMAGE_BYTES_MODEL, IMAGE_MODEL, TEXT_MODEL, text_model

# A declaration for type checkers; the records are in backends.py (a test holds the two equal).
Backend = Literal["onnxruntime", "python", "npu_ge"]
BACKENDS: tuple[str, ...] = tuple(TRITON_BACKENDS)
PREPROCESS_MODEL, ENSEMBLE_MODEL = "preprocess", IMAGE_BYTES_MODEL
# Tower → (Triton model, input tensor, output tensor): the names our /v2 endpoint serves.
TOWER_MODELS = {"text": (TEXT_MODEL, "text", "text_features"), "image": (IMAGE_MODEL, "image", "image_features")}
_TRITON_TYPES = {
    onnx.TensorProto.FLOAT: "TYPE_FP32",
    onnx.TensorProto.FLOAT16: "TYPE_FP16",
    onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.INT32: "TYPE_INT32",
}
PREPROCESS_SOURCE = Path(__file__).with_name("preprocess.py")


@dataclass(frozen=True)
class Symbol:
    """An enum value in protobuf text format (written bare, not quoted)."""

    name: str


@dataclass(frozen=True)
class ExportOptions:
    backend: Backend = "onnxruntime"
    instances: int = 1
    max_batch: int | None = None  # onnxruntime/python: max_batch_size; npu_ge: the static bucket
    aicore: str | None = None  # npu_ge "cube|vector" cores per stream, e.g. "12|10"
    device_ids: tuple[int, ...] = ()
    precision: str | None = None  # default: fp16 for npu_ge when present, else fp32
    queue_delay_us: int = 4000
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 50_000_000


@dataclass
class ExportReport:
    repository: Path
    models: list[str] = field(default_factory=list)
    batch: dict[str, int] = field(default_factory=dict)  # Triton model → max_batch_size (or the static batch)
    source_bucket: dict[str, int] = field(default_factory=dict)  # Triton model → bucket graph it came from


# --- protobuf text format ---------------------------------------------------------------------------


def render_pbtxt(message: dict[str, Any], indent: int = 0) -> str:
    """Protobuf text format for a message given as a dict (lists = repeated fields, dicts = messages)."""
    pad = "  " * indent
    lines: list[str] = []
    for key, value in message.items():
        if value is None:
            continue
        if isinstance(value, list) and value and isinstance(value[0], dict):
            for item in value:
                lines.append(f"{pad}{key} {{\n{render_pbtxt(item, indent + 1)}{pad}}}")
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [ {', '.join(_scalar(v) for v in value)} ]")
        elif isinstance(value, dict):
            lines.append(f"{pad}{key} {{\n{render_pbtxt(value, indent + 1)}{pad}}}")
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")
    return "".join(line + "\n" for line in lines)


def _scalar(value: Any) -> str:
    if isinstance(value, Symbol):
        return value.name
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)  # a quoted, escaped string


def _parameters(values: dict[str, str]) -> list[dict[str, Any]]:
    return [{"key": k, "value": {"string_value": v}} for k, v in values.items()]


# --- configs ------------------------------------------------------------------------------------------


def _instance_group(options: ExportOptions, record: TritonBackend) -> list[dict[str, Any]]:
    group: dict[str, Any] = {"count": options.instances}
    if record.device_ids_as_gpus and options.device_ids:
        group.update(kind=Symbol("KIND_GPU"), gpus=list(options.device_ids))
    elif record.instance_kind is not None:
        group["kind"] = Symbol(record.instance_kind)
    return [group]


def _tower_config(
    name: str, input_name: str, input_type: str, input_dims: list[int], output_name: str, dim: int,
    options: ExportOptions, batch: int, buckets: list[int],
) -> dict[str, Any]:  # fmt: skip
    record = triton_backend(options.backend)
    config: dict[str, Any] = {"name": name, "backend": record.name}
    if record.dynamic_batching:
        config["max_batch_size"] = batch
        config["input"] = [{"name": input_name, "data_type": Symbol(input_type), "dims": input_dims}]
        config["output"] = [{"name": output_name, "data_type": Symbol("TYPE_FP32"), "dims": [dim]}]
    else:  # a static graph: one fixed batch, so full shapes and no Triton batching at all
        config["max_batch_size"] = 0
        config["input"] = [{"name": input_name, "data_type": Symbol(input_type), "dims": [batch, *input_dims]}]
        config["output"] = [{"name": output_name, "data_type": Symbol("TYPE_FP32"), "dims": [batch, dim]}]
    config["instance_group"] = _instance_group(options, record)
    if record.dynamic_batching:
        config["dynamic_batching"] = {
            "preferred_batch_size": [b for b in buckets if 1 < b <= batch] or [batch],
            "max_queue_delay_microseconds": options.queue_delay_us,
        }
    params = record.parameters(options.device_ids, options.aicore)
    if params:
        config["parameters"] = _parameters(params)
    return config


def _batching(options: ExportOptions) -> bool:
    """Whether the image pipeline batches in Triton: yes where the towers do; a static graph cannot."""
    return triton_backend(options.backend).dynamic_batching


def _preprocess_config(manifest: ModelManifest, options: ExportOptions, batch: int) -> dict[str, Any]:
    size = manifest.image_size
    # Every model of the ensemble batches, or none does: Triton mishandles an ensemble output when a
    # non-batching ensemble ends in a batching model (triton-inference-server/server#7189).
    if _batching(options):
        shapes = {"max_batch_size": batch, "in": [1], "out": [3, size, size]}
    else:
        shapes = {"max_batch_size": 0, "in": [-1], "out": [-1, 3, size, size]}
    return {
        "name": PREPROCESS_MODEL,
        "backend": "python",
        "max_batch_size": shapes["max_batch_size"],
        "input": [{"name": "image_bytes", "data_type": Symbol("TYPE_STRING"), "dims": shapes["in"]}],
        "output": [{"name": "image", "data_type": Symbol("TYPE_FP32"), "dims": shapes["out"]}],
        "instance_group": [{"count": max(2, options.instances), "kind": Symbol("KIND_CPU")}],
        "parameters": _parameters(
            {
                "image_size": str(size),
                "mean": json.dumps(list(manifest.mean)),
                "std": json.dumps(list(manifest.std)),
                "interpolation": "bicubic",
                "max_image_bytes": str(options.max_image_bytes),
                "max_image_pixels": str(options.max_image_pixels),
            }
        ),
    }


def _ensemble_config(manifest: ModelManifest, options: ExportOptions, batch: int) -> dict[str, Any]:
    if _batching(options):  # clients send [n, 1] files and get [n, d]
        max_batch, in_dims, out_dims = batch, [1], [manifest.embed_dim]
    else:  # a static image graph takes exactly `batch` images
        max_batch, in_dims, out_dims = 0, [batch], [batch, manifest.embed_dim]
    return {
        "name": ENSEMBLE_MODEL,
        "platform": "ensemble",
        "max_batch_size": max_batch,
        "input": [{"name": "image_bytes", "data_type": Symbol("TYPE_STRING"), "dims": in_dims}],
        "output": [{"name": "image_features", "data_type": Symbol("TYPE_FP32"), "dims": out_dims}],
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": PREPROCESS_MODEL,
                    "model_version": -1,
                    "input_map": [{"key": "image_bytes", "value": "image_bytes"}],
                    "output_map": [{"key": "image", "value": "preprocessed_image"}],
                },
                {
                    "model_name": IMAGE_MODEL,
                    "model_version": -1,
                    "input_map": [{"key": "image", "value": "preprocessed_image"}],
                    "output_map": [{"key": "image_features", "value": "image_features"}],
                },
            ]
        },
    }


# --- the repository -----------------------------------------------------------------------------------


def _check_options(manifest: ModelManifest, options: ExportOptions) -> str:
    try:
        record = triton_backend(options.backend)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if options.instances < 1:
        raise InvalidInput("--instances must be at least 1")
    if options.aicore is not None:
        if not record.takes_aicore:
            takes = ", ".join(r.name for r in TRITON_BACKENDS.values() if r.takes_aicore)
            raise InvalidInput(f"--aicore only applies to --backend {takes} (Ascend ge-backend core locking)")
        parts = options.aicore.split("|")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise InvalidInput(f"--aicore takes 'cube|vector' core counts such as 12|10, got '{options.aicore}'")
    if options.max_batch is not None and options.max_batch < 1:
        raise InvalidInput("--max-batch must be at least 1")
    available = [p for p in ("fp32", "fp16", "int8") if all(p in t.graphs for t in manifest.towers.values())]
    default = next((p for p in record.precisions if p in available), record.precisions[-1])
    precision = options.precision or default
    if precision not in available:
        raise InvalidInput(f"model {manifest.name} has no {precision} graphs for both towers (it has {available})")
    return precision


def export_triton_repository(model_dir: Path, out: Path, options: ExportOptions, force: bool = False) -> ExportReport:
    """Write the repository to `out` (built in a sibling temp folder, then moved into place)."""
    manifest = ModelManifest.load(model_dir)
    precision = _check_options(manifest, options)
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise InvalidInput(f"{out} exists and is not empty; pass --force to replace it")
    staging = out.parent / f".{out.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        report = _write_models(manifest, staging, out, options, precision)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # never leave a half-written repository behind
        raise
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return report


def _tower_models(manifest: ModelManifest, precision: str) -> list[tuple[str, str, int | None]]:
    """(Triton model, tower, text length or None for the full input) of every tower model to write:
    a text model per length bucket, so that a client can send the shortest that holds its texts."""
    shorter = manifest.text_lengths(precision)[:-1]
    return [
        (TEXT_MODEL, "text", None),
        *((text_model(length), "text", length) for length in shorter),
        (IMAGE_MODEL, "image", None),
    ]


def _write_models(
    manifest: ModelManifest, staging: Path, out: Path, options: ExportOptions, precision: str
) -> ExportReport:
    report = ExportReport(repository=out)
    record = triton_backend(options.backend)
    batch_of_image = 0
    for name, tower, length in _tower_models(manifest, precision):
        spec = manifest.towers[tower]
        input_name, output_name = ("text", "text_features") if tower == "text" else ("image", "image_features")
        buckets = spec.buckets(precision)
        batch = options.max_batch or buckets[-1]
        if record.dynamic_batching:
            graph, source = dynamic_batch_graph(manifest, tower, precision, length=length)
        else:
            if batch not in buckets:
                raise InvalidInput(f"--max-batch {batch} is not a bucket of the {tower} graphs {buckets}")
            graph, source = load_graph(manifest, tower, precision, batch, length), batch
        rename_io(graph, spec.input_name, input_name)
        rename_io(graph, spec.output_name, output_name)
        tensor_type = graph.graph.input[0].type.tensor_type
        input_dims = [d.dim_value for d in tensor_type.shape.dim][1:]
        input_type = _TRITON_TYPES.get(tensor_type.elem_type)
        if record.fp32_inputs and input_type == "TYPE_FP16":
            input_type = "TYPE_FP32"  # the model casts; the ensemble's preprocess step gives FP32
        if input_type is None:
            raise ModelError(f"{tower} graph input has an element type Triton configs here do not cover")
        version_dir = staging / name / "1"
        version_dir.mkdir(parents=True)
        # Protobuf caps one message at 2 GB; bigger towers (ViT-H fp32) keep their weights beside the graph.
        external = graph.ByteSize() > 1_800_000_000
        onnx.save_model(
            graph, str(version_dir / "model.onnx"), save_as_external_data=external, location="model.onnx.data"
        )
        for file_name, source_file in record.model_files.items():
            shutil.copyfile(source_file, version_dir / file_name)
        config = _tower_config(
            name, input_name, input_type, input_dims, output_name, manifest.embed_dim, options, batch, buckets
        )
        (staging / name / "config.pbtxt").write_text(render_pbtxt(config), encoding="utf-8")
        report.models.append(name)
        report.batch[name] = batch
        report.source_bucket[name] = source
        if tower == "image":
            batch_of_image = batch
    (staging / PREPROCESS_MODEL / "1").mkdir(parents=True)
    shutil.copyfile(PREPROCESS_SOURCE, staging / PREPROCESS_MODEL / "1" / "model.py")
    (staging / PREPROCESS_MODEL / "config.pbtxt").write_text(
        render_pbtxt(_preprocess_config(manifest, options, batch_of_image)), encoding="utf-8"
    )
    (staging / ENSEMBLE_MODEL / "1").mkdir(parents=True)  # Triton wants a version folder, even an empty one
    (staging / ENSEMBLE_MODEL / "config.pbtxt").write_text(
        render_pbtxt(_ensemble_config(manifest, options, batch_of_image)), encoding="utf-8"
    )
    report.models += [PREPROCESS_MODEL, ENSEMBLE_MODEL]
    return report
