"""Triton Python-backend model for one tower: the ONNX graph beside it, run with ONNX Runtime.

`cnclip export-triton --backend python` copies this file to `<repo>/cnclip_text/1/model.py` and
`<repo>/cnclip_image/1/model.py`, next to the tower's batch-dynamic `model.onnx`. It runs inside
Triton's Python backend, where this project is not installed, so it imports only numpy and
onnxruntime. Useful where Triton has no onnxruntime backend of its own (the `nvidia-pytriton` build,
or an Ascend host: onnxruntime-cann's CANN provider runs the graph on the NPU).

Triton's dynamic batcher hands `execute` several requests at once; their rows run as one batch.
The config's `parameters`:
- `provider`: `auto` (an Ascend NPU when the CANN toolkit and a /dev/davinciN device are there, a
  CUDA GPU for a KIND_GPU instance, else the CPU), or `cpu`, `cuda`, `cann`;
- `device_ids`: NPU/GPU numbers the instances are spread over, e.g. "0,1" (instance i gets
  device i mod n); a KIND_GPU instance uses the GPU Triton gave it;
- `intra_op_threads`: ONNX Runtime threads per instance (0 = its default, one per core).
Inputs of a float graph arrive as FP32 and are cast to the graph's type (an fp16 graph too); the
output is always FP32.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any

import numpy as np

_GRAPH_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}
_ASCEND_LIBS = ("lib64", "latest/lib64", "ascend-toolkit/latest/lib64")


def _has_ascend() -> bool:
    homes = [os.environ.get("ASCEND_HOME_PATH"), os.environ.get("ASCEND_TOOLKIT_HOME"), "/usr/local/Ascend"]
    toolkit = any(os.path.isfile(os.path.join(h, lib, "libascendcl.so")) for h in homes if h for lib in _ASCEND_LIBS)
    return toolkit and bool(glob.glob("/dev/davinci[0-9]*"))


def choose_provider(requested: str, available: list[str], instance_kind: str) -> tuple[str, str]:
    """(provider, reason): `auto` | `cpu` | `cuda` | `cann` → one ONNX Runtime provider."""
    names = {"cann": "CANNExecutionProvider", "cuda": "CUDAExecutionProvider"}
    if requested == "cpu":
        return "cpu", "provider=cpu"
    if requested in names:
        if names[requested] not in available:
            raise ValueError(f"provider={requested} but this onnxruntime has no {names[requested]} ({available})")
        return requested, f"provider={requested}"
    if requested != "auto":
        raise ValueError(f"unknown provider '{requested}'; use auto, cpu, cuda or cann")
    if names["cann"] in available and _has_ascend():
        return "cann", "auto: CANN toolkit and an NPU device"
    if names["cuda"] in available and instance_kind == "GPU":
        return "cuda", "auto: a KIND_GPU instance"
    return "cpu", "auto: no NPU or GPU instance"


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
        device = int(args.get("model_instance_device_id", 0) or 0)
        device_ids = [int(d) for d in params.get("device_ids", "").split(",") if d.strip()]
        if device_ids and kind != "GPU":
            # Triton has no NPU instance kind: spread the instances (…_0_<i>) over the listed devices.
            match = re.search(r"_(\d+)$", args.get("model_instance_name", ""))
            device = device_ids[int(match.group(1)) % len(device_ids) if match else 0]
        if provider == "cann":
            options = {"device_id": str(device), "enable_cann_graph": "1", "precision_mode": "must_keep_origin_dtype"}
            providers: list[Any] = [("CANNExecutionProvider", options), "CPUExecutionProvider"]
        elif provider == "cuda":
            providers = [("CUDAExecutionProvider", {"device_id": str(device)}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]

        session_options = ort.SessionOptions()
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session_options.inter_op_num_threads = 1
        session_options.log_severity_level = 3
        threads = int(params.get("intra_op_threads", "0") or 0)
        if threads > 0:
            session_options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(path, session_options, providers=providers)
        graph_input = self.session.get_inputs()[0]
        self.graph_input = graph_input.name
        self.graph_dtype = _GRAPH_TYPES.get(graph_input.type, np.float32)
        self.graph_output = self.session.get_outputs()[0].name
        self.provider = f"{provider} (device {device})" if provider != "cpu" else "cpu"
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
