"""Triton's model configuration for `/v2` (`GET /v2/models/{name}/config`): the JSON of Triton's
`ModelConfig`, with the names, data types and dims `cnclip export-triton` writes into config.pbtxt."""

from __future__ import annotations

import json
from typing import Any

from api.kserve_tensors import MAX_BATCH, ServedModel
from retrieval.config import RuntimeSettings

PLATFORM = "cnclip"  # metadata `platform` and config `backend`: our batcher and ONNX Runtime sessions
_CONFIG_TYPES = {"INT64": "TYPE_INT64", "FP32": "TYPE_FP32", "BYTES": "TYPE_STRING"}


def model_config(model: ServedModel, encoder: Any, settings: RuntimeSettings | None) -> dict[str, Any]:
    """The model's configuration as Triton's `GET .../config` returns it (JSON of `ModelConfig`).

    Names, data types and dims are those `cnclip export-triton` writes into config.pbtxt;
    `max_batch_size` is this server's per-request limit, the preferred batch sizes are the encoder's
    buckets and the instance group its streams on its provider.
    """
    buckets = list(getattr(encoder, "buckets", {}).get(model.tower) or getattr(settings, "buckets", None) or [1])
    provider = getattr(getattr(encoder, "provider", None), "name", None) or "remote"
    precision = getattr(encoder, "precision", {}).get(model.tower, "")
    config: dict[str, Any] = {
        "name": model.name,
        "platform": PLATFORM,
        "backend": PLATFORM,
        "runtime": "",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": MAX_BATCH,
        **_tensors(model, encoder),
        "batch_input": [],
        "batch_output": [],
        "optimization": {
            "priority": "PRIORITY_DEFAULT",
            "input_pinned_memory": {"enable": True},
            "output_pinned_memory": {"enable": True},
            "gather_kernel_buffer_threshold": 0,
            "eager_batching": False,
        },
    }
    if getattr(settings, "dynamic_batching", True):
        config["dynamic_batching"] = _dynamic_batching(buckets, settings)
    config["instance_group"] = [_instance_group(model, encoder, settings)]
    config["default_model_filename"] = ""
    config["cc_model_filenames"] = {}
    config["metric_tags"] = {}
    params = {"provider": provider, "precision": precision, "buckets": json.dumps(buckets)}
    config["parameters"] = {k: {"string_value": str(v)} for k, v in params.items()}
    config["model_warmup"] = []
    return config


def _tensors(model: ServedModel, encoder: Any) -> dict[str, Any]:
    """The `input` and `output` entries: one tensor each."""
    tensor_input = {
        "name": model.input_name,
        "data_type": _CONFIG_TYPES[model.datatype],
        "format": "FORMAT_NONE",
        "dims": model.input_dims(encoder),
        "is_shape_tensor": False,
        "allow_ragged_batch": False,
        "optional": False,
        "is_non_linear_format_io": False,
    }
    tensor_output = {
        "name": model.output_name,
        "data_type": "TYPE_FP32",
        "dims": [int(encoder.dim)],
        "label_filename": "",
        "is_shape_tensor": False,
        "is_non_linear_format_io": False,
    }
    return {"input": [tensor_input], "output": [tensor_output]}


def _dynamic_batching(buckets: list[int], settings: RuntimeSettings | None) -> dict[str, Any]:
    return {
        "preferred_batch_size": [b for b in buckets if b <= MAX_BATCH],
        "max_queue_delay_microseconds": int(round(float(getattr(settings, "max_queue_delay_ms", 0.0)) * 1000)),
        "preserve_ordering": False,
        "priority_levels": 0,
        "default_priority_level": 0,
        "priority_queue_policy": {},
    }


def _instance_group(model: ServedModel, encoder: Any, settings: RuntimeSettings | None) -> dict[str, Any]:
    """The tower's streams on its device, of the kind its backend's record says (Triton has no NPU
    kind: KIND_MODEL, also for a remote encoder)."""
    plan = getattr(encoder, "plans", {}).get(model.tower)
    kind = plan.backend.triton_kind(plan.device.name) if plan is not None else "KIND_MODEL"
    device = int(getattr(settings, "device_id", 0) or 0)
    return {
        "name": f"{model.name}_0",
        "kind": kind,
        "count": int(getattr(settings, "streams", 1) or 1),
        "gpus": [device] if kind == "KIND_GPU" else [],
        "secondary_devices": [],
        "profile": [],
        "passive": False,
        "host_policy": "",
    }
