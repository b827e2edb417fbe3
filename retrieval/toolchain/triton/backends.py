"""The Triton backends `cnclip export-triton --backend` writes for: one record each (the registry).

A record says everything the exporter, the command and the launcher used to branch on: whether the
tower models batch dynamically (a batch-dynamic graph, `max_batch_size` and Triton's dynamic batcher)
or run one static bucket graph, the instance group's kind and what `--device-ids` becomes, the
config's parameters, the files copied beside each tower's graph, the default precision, and how to
serve the result. export.py, cli/triton.py and server.py read these records; nothing else names a
Triton backend.

Adding one is a `TritonBackend(...)` in `TRITON_BACKENDS` (and its name in export.py's `Backend`
`Literal`, which a test holds equal to the registry).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# The Python-backend tower model and the provider registry it loads by path (it runs where this
# package is not installed, so the registry travels with it: one source of truth).
TOWER_SOURCE = Path(__file__).with_name("onnx_model.py")
# (By path, not by import: `cnclip --help` imports this module, and retrieval.backends brings numpy.)
ORT_PROVIDERS_SOURCE = Path(__file__).resolve().parents[2] / "backends" / "ort_providers.py"
KIND_CPU = "KIND_CPU"


def _device_ids(device_ids: tuple[int, ...]) -> dict[str, str]:
    return {"device_ids": ",".join(map(str, device_ids))} if device_ids else {}


def _no_parameters(device_ids: tuple[int, ...], aicore: str | None) -> dict[str, str]:
    return {}


def _python_parameters(device_ids: tuple[int, ...], aicore: str | None) -> dict[str, str]:
    # The model picks its provider itself (onnx_model.py); `auto` reads the instance kind and the host.
    return {"provider": "auto", "intra_op_threads": "0", **_device_ids(device_ids)}


def _ge_parameters(device_ids: tuple[int, ...], aicore: str | None) -> dict[str, str]:
    # Triton has no NPU kind: the ge-backend places its instances (streams) on `device_ids` itself.
    return {"static_model": "true", **({"ge.aicoreNum": aicore} if aicore else {}), **_device_ids(device_ids)}


@dataclass(frozen=True)
class TritonBackend:
    """One Triton backend a repository can be exported for.

    - `name`: the `--backend` value and the tower configs' `backend`;
    - `summary`: what it is and runs on (`--backend`'s help);
    - `dynamic_batching`: batch-dynamic graphs with `max_batch_size` and Triton's dynamic batcher
      (the image pipeline batches end to end); False: the fixed graph of one bucket, full shapes;
    - `instance_kind`: the instance group's kind (None: KIND_AUTO, Triton's choice);
    - `device_ids_as_gpus`: `--device-ids` become the group's KIND_GPU `gpus` (else a parameter);
    - `parameters(device_ids, aicore)`: the tower configs' `parameters`;
    - `model_files`: file name in `1/` → the source copied there (a Python-backend model and its helpers);
    - `fp32_inputs`: float inputs are declared FP32 (the model casts them to the graph's type);
    - `takes_aicore`: `--aicore` (Ascend core locking) applies;
    - `precisions`: the default graph precision, the first the model has;
    - `serve_hint`: how to serve what was written (`{repository}` is filled in);
    - `missing_hint`: what to do when the nvidia-pytriton wheel's tritonserver lacks it (None: it has it).
    """

    name: str
    summary: str
    dynamic_batching: bool
    instance_kind: str | None
    device_ids_as_gpus: bool
    parameters: Callable[[tuple[int, ...], str | None], dict[str, str]] = field(compare=False)
    serve_hint: str
    missing_hint: str | None = None
    model_files: dict[str, Path] = field(default_factory=dict)
    fp32_inputs: bool = False
    takes_aicore: bool = False
    precisions: tuple[str, ...] = ("fp32",)


def _built_with(where: str) -> str:
    return (
        f"serve it with a Triton built with {where}: tritonserver --model-repository {{repository}}\n"
        "(its Python backend imports numpy and Pillow for the preprocess model; "
        "`cnclip triton-server` serves only --backend python exports)"
    )


TRITON_BACKENDS: dict[str, TritonBackend] = {
    record.name: record
    for record in (
        TritonBackend(
            "onnxruntime",
            "onnxruntime (CPU/GPU, dynamic batching)",
            dynamic_batching=True,
            instance_kind=None,  # KIND_AUTO: the GPUs when there are any
            device_ids_as_gpus=True,
            parameters=_no_parameters,
            serve_hint=_built_with("NVIDIA's Triton image (nvcr.io/nvidia/tritonserver)"),
            missing_hint="re-export with `cnclip export-triton --backend python` (ONNX Runtime inside the Python "
            "backend), or serve this repository with NVIDIA's Triton image (nvcr.io/nvidia/tritonserver)",
        ),
        TritonBackend(
            "python",
            "python (ONNX Runtime inside Triton's Python backend: CPU, CUDA or CANN, dynamic batching)",
            dynamic_batching=True,
            instance_kind=KIND_CPU,  # the model picks its provider itself; Triton has no NPU kind
            device_ids_as_gpus=False,
            parameters=_python_parameters,
            serve_hint="serve it with: cnclip triton-server {repository}",
            model_files={"model.py": TOWER_SOURCE, "ort_providers.py": ORT_PROVIDERS_SOURCE},
            fp32_inputs=True,  # the model casts; the ensemble's preprocess step gives FP32
        ),
        TritonBackend(
            "npu_ge",
            "npu_ge (Ascend ge-backend, static)",
            dynamic_batching=False,
            instance_kind=KIND_CPU,
            device_ids_as_gpus=False,
            parameters=_ge_parameters,
            serve_hint=_built_with("Ascend's ge-backend"),
            missing_hint="serve it with a Triton built with Ascend's ge-backend, or re-export with --backend python",
            takes_aicore=True,
            precisions=("fp16", "fp32"),
        ),
    )
}


def triton_backend(name: str) -> TritonBackend:
    """The record called `name`; any other name is a `ValueError` that lists the known ones."""
    record = TRITON_BACKENDS.get(name)
    if record is None:
        raise ValueError(f"--backend must be one of {', '.join(TRITON_BACKENDS)}, got '{name}'")
    return record
