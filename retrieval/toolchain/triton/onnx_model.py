"""Triton Python-backend model for one tower: the ONNX graph beside it, run with ONNX Runtime.

`cnclip export-triton --backend python` copies this file to `<repo>/cnclip_text/1/model.py` and
`<repo>/cnclip_image/1/model.py`, next to the tower's batch-dynamic `model.onnx`, with the provider
registry `retrieval/backends/ort_providers.py` beside it as `ort_providers.py`. It runs inside
Triton's Python backend, where this project is not installed, so it imports only numpy and
onnxruntime, and loads the registry by path (from the source tree when it is not beside it).
Useful where Triton has no onnxruntime backend of its own (the `nvidia-pytriton` build, or an
Ascend host: onnxruntime-cann's CANN provider runs the graph on the NPU).

Triton's dynamic batcher hands `execute` several requests at once; their rows run as one batch.
The config's `parameters`:
- `provider`: `auto` or a provider of the registry (`cann`, `cuda`, `cpu`). `auto` takes the first
  accelerator the onnxruntime build has that fits: one Triton has an instance kind for (a CUDA GPU:
  KIND_GPU) when this instance is of that kind, one it has none for (an Ascend NPU) when its
  hardware is detected; else the CPU;
- `device_ids`: NPU/GPU numbers the instances are spread over, e.g. "0,1" (instance i gets
  device i mod n); a KIND_GPU instance uses the GPU Triton gave it;
- `intra_op_threads`: ONNX Runtime threads per instance (0 = its default, one per core).
Inputs of a float graph arrive as FP32 and are cast to the graph's type (an fp16 graph too); the
output is always FP32.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from types import ModuleType
from typing import Any

import numpy as np

_GRAPH_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}
_HERE = os.path.dirname(os.path.abspath(__file__))
# The registry: beside this file in an exported repository, in the package in the source tree.
_REGISTRY_PATHS = (
    os.path.join(_HERE, "ort_providers.py"),
    os.path.join(_HERE, os.pardir, os.pardir, "backends", "ort_providers.py"),
)


def _load_registry() -> ModuleType:
    path = next((p for p in _REGISTRY_PATHS if os.path.isfile(p)), None)
    if path is None:
        raise ImportError(f"ort_providers.py is neither beside {__file__} nor in the source tree")
    spec = importlib.util.spec_from_file_location("cnclip_ort_providers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


providers = _load_registry()


def choose_provider(requested: str, available: list[str], instance_kind: str) -> tuple[str, str]:
    """(provider, reason): `auto` or a provider's name → one ONNX Runtime provider.

    `instance_kind` is Triton's `model_instance_kind` (CPU, GPU, MODEL)."""
    if requested != "auto":
        if requested not in providers.PROVIDERS:
            raise ValueError(f"unknown provider '{requested}'; use {providers.setting_choices()}")
        record = providers.PROVIDERS[requested]
        if record.ort_name not in available:
            raise ValueError(f"provider={requested} but this onnxruntime has no {record.ort_name} ({available})")
        return requested, f"provider={requested}"
    for record in providers.accelerators():
        if record.ort_name not in available:
            continue
        if record.triton_kind == f"KIND_{instance_kind}":
            return record.name, f"auto: a {record.triton_kind} instance"
        if record.triton_kind == providers.KIND_MODEL:
            found = record.detect()
            if found.found:
                return record.name, f"auto: {found.reason}"
    return providers.HOST.name, "auto: no NPU or GPU instance"


class TritonPythonModel:
    """One input (INT64 token ids or FP32 pixels) → one FP32 output, rows of all requests batched."""

    def initialize(self, args: dict[str, Any]) -> None:
        import onnxruntime as ort

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]
        path = os.path.join(args["model_repository"], args["model_version"], params.get("onnx_file", "model.onnx"))

        kind = args.get("model_instance_kind", "CPU")
        provider, reason = choose_provider(params.get("provider", "auto"), ort.get_available_providers(), kind)
        record = providers.PROVIDERS[provider]
        device = int(args.get("model_instance_device_id", 0) or 0)
        device_ids = [int(d) for d in params.get("device_ids", "").split(",") if d.strip()]
        if device_ids and record.triton_kind != f"KIND_{kind}":
            # Triton did not place this instance on its device (no NPU kind, or a CPU instance):
            # spread the instances (…_0_<i>) over the listed devices.
            match = re.search(r"_(\d+)$", args.get("model_instance_name", ""))
            device = device_ids[int(match.group(1)) % len(device_ids) if match else 0]

        session_options = ort.SessionOptions()
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session_options.inter_op_num_threads = 1
        session_options.log_severity_level = 3
        threads = int(params.get("intra_op_threads", "0") or 0)
        if threads > 0:
            session_options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(path, session_options, providers=record.session_providers(device))
        graph_input = self.session.get_inputs()[0]
        self.graph_input = graph_input.name
        self.graph_dtype = _GRAPH_TYPES.get(graph_input.type, np.float32)
        self.graph_output = self.session.get_outputs()[0].name
        self.provider = provider if record.on_host else f"{provider} (device {device})"
        self._log(f"{args.get('model_name')}: ONNX Runtime on {self.provider}, {reason}; graph {path}")

    @staticmethod
    def _log(message: str) -> None:
        try:
            import triton_python_backend_utils as pb_utils

            pb_utils.Logger.log_info(message)
        except (ImportError, AttributeError):  # outside Triton (tests) or an old backend without Logger
            pass

    def run(self, batch: np.ndarray) -> np.ndarray:
        """The graph on one batch: rows in, FP32 rows out."""
        feed = np.ascontiguousarray(batch, dtype=self.graph_dtype)
        (features,) = self.session.run([self.graph_output], {self.graph_input: feed})
        return np.ascontiguousarray(features, dtype=np.float32)

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils  # only exists inside Triton

        arrays = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests]
        try:
            features = self.run(np.concatenate(arrays) if len(arrays) > 1 else arrays[0])
        except Exception as exc:  # ONNX Runtime's errors have many types; each request gets the message
            error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        responses, start = [], 0
        for array in arrays:
            rows = features[start : start + len(array)]
            start += len(array)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(self.output_name, rows)]))
        return responses
