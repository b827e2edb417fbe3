"""ONNX Runtime's execution providers: one record per value of `CNCLIP_PROVIDER` (the registry).

A record says what every caller used to branch on: ONNX Runtime's name for the provider, the
provider options for a device number, how to tell whether its hardware is here, whether it runs on
the host's cores, the order in which `auto` takes precisions, and which Triton instance kind it is.
`retrieval/backends/onnxruntime.py` (the runtime) and Triton's Python-backend model
(`retrieval/toolchain/triton/onnx_model.py`) both read these records; nothing else names a provider.

The standard library only, on purpose: the Triton model runs inside Triton's Python backend, where
this package is not installed, so `cnclip export-triton --backend python` copies this file beside the
model (`1/ort_providers.py`) and the model loads it by path. One source of truth, also there.

Adding a provider is one `OrtProvider(...)` in `PROVIDERS` (docs/backends.md), plus its value in the
`CNCLIP_PROVIDER` setting's `Literal` (a test holds the two equal).
"""

from __future__ import annotations

import ctypes.util
import glob
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ASCEND_DEFAULT_HOME = Path("/usr/local/Ascend")
# Triton's instance kind for a device it has no kind for (an NPU): the model places itself.
KIND_MODEL = "KIND_MODEL"


@dataclass(frozen=True)
class Detection:
    """The outcome of looking for one kind of engine or accelerator, with the reason in words.

    Shared by every backend (retrieval/backends/base.py re-exports it); defined here so that the copy
    beside a Triton model has it too."""

    found: bool
    reason: str


def detect_ascend(environ: Mapping[str, str] | None = None, devices: Sequence[str] | None = None) -> Detection:
    """An Ascend NPU is usable when the CANN runtime library and a /dev/davinciN device are both present."""
    # CANN's own set_env.sh exports ASCEND_HOME_PATH; it is not one of our settings, so read it here.
    env = os.environ if environ is None else environ
    homes = [Path(p) for p in (env.get("ASCEND_HOME_PATH"), env.get("ASCEND_TOOLKIT_HOME")) if p]
    homes.append(ASCEND_DEFAULT_HOME)
    library = next(
        (
            lib
            for home in homes
            for lib in (
                home / "lib64" / "libascendcl.so",
                home / "latest" / "lib64" / "libascendcl.so",
                home / "ascend-toolkit" / "latest" / "lib64" / "libascendcl.so",
            )
            if lib.is_file()
        ),
        None,
    )
    if library is None:
        return Detection(False, "no CANN toolkit (libascendcl.so not under ASCEND_HOME_PATH or /usr/local/Ascend)")
    found_devices = sorted(glob.glob("/dev/davinci[0-9]*") if devices is None else devices)
    if not found_devices:
        return Detection(False, f"CANN toolkit at {library.parent.parent} but no /dev/davinciN device is visible")
    return Detection(True, f"CANN toolkit at {library.parent.parent} and {len(found_devices)} NPU device(s)")


def detect_cuda(devices: Sequence[str] | None = None, libcuda: str | None | bool = False) -> Detection:
    """A CUDA GPU is usable when the driver library and a /dev/nvidiaN device are both present."""
    library = ctypes.util.find_library("cuda") if libcuda is False else libcuda
    if not library:
        return Detection(False, "no CUDA driver (libcuda not found)")
    found_devices = sorted(glob.glob("/dev/nvidia[0-9]*") if devices is None else devices)
    if not found_devices:
        return Detection(False, "CUDA driver present but no /dev/nvidiaN device is visible")
    return Detection(True, f"CUDA driver and {len(found_devices)} GPU device(s)")


def _host_cpu() -> Detection:
    return Detection(True, "the host CPU")


def _no_options(device_id: int) -> dict[str, str]:
    return {}


def _device_only(device_id: int) -> dict[str, str]:
    return {"device_id": str(device_id)}


def _cann_options(device_id: int) -> dict[str, str]:
    return {
        "device_id": str(device_id),
        # One static model per input shape, compiled once at warm-up: why buckets are fixed.
        "enable_cann_graph": "1",
        # CANN defaults to force_fp16; keep each graph's own dtypes (fp32 stays fp32, fp16 is fp16).
        "precision_mode": "must_keep_origin_dtype",
    }


@dataclass(frozen=True)
class OrtProvider:
    """One execution provider of ONNX Runtime.

    - `name`: the `CNCLIP_PROVIDER` value (and the Triton model's `provider` parameter);
    - `ort_name`: ONNX Runtime's name for it (what `get_available_providers()` lists);
    - `detect()`: whether its hardware (driver/toolkit and a device) is here, never raises;
    - `options(device_id)`: its provider options for one device;
    - `on_host`: it runs on the host's cores: sessions get thread counts and affinity, bucket
      sessions can share one copy of the weights, and it is the fallback behind every accelerator;
    - `precisions`: the graph variants `auto` takes, fastest safe first;
    - `triton_kind`: Triton's instance kind for it (`KIND_MODEL`: Triton has none, the model
      places itself on `device_ids`);
    - `hardware`: what it runs on, in words (log lines).
    """

    name: str
    ort_name: str
    detect: Callable[[], Detection] = field(compare=False)
    options: Callable[[int], dict[str, str]] = field(compare=False)
    on_host: bool
    precisions: tuple[str, ...]
    triton_kind: str
    hardware: str

    def session_providers(self, device_id: int = 0) -> list[tuple[str, dict[str, str]] | str]:
        """The `providers=` argument for `ort.InferenceSession`: this provider with its options first,
        the host CPU as fallback (the host CPU alone for itself)."""
        if self.on_host:
            return [self.ort_name]
        return [(self.ort_name, self.options(device_id)), HOST.ort_name]


# `auto`'s order of preference: an NPU, then a GPU, then the host CPU (always last, always there).
PROVIDERS: dict[str, OrtProvider] = {
    record.name: record
    for record in (
        OrtProvider(
            "cann", "CANNExecutionProvider", detect_ascend, _cann_options,
            on_host=False, precisions=("fp16", "fp32", "int8"), triton_kind=KIND_MODEL, hardware="an Ascend NPU",
        ),
        OrtProvider(
            "cuda", "CUDAExecutionProvider", detect_cuda, _device_only,
            on_host=False, precisions=("fp16", "fp32", "int8"), triton_kind="KIND_GPU", hardware="a CUDA GPU",
        ),
        OrtProvider(
            "cpu", "CPUExecutionProvider", _host_cpu, _no_options,
            on_host=True, precisions=("int8", "fp32", "fp16"), triton_kind="KIND_CPU", hardware="the host CPU",
        ),
    )
}  # fmt: skip
HOST = next(record for record in PROVIDERS.values() if record.on_host)


def provider_named(name: str) -> OrtProvider:
    """The record called `name`; any other name is a `ValueError` that lists the known ones."""
    record = PROVIDERS.get(name)
    if record is None:
        raise ValueError(f"unknown provider {name!r}; known: {', '.join(PROVIDERS)}")
    return record


def accelerators() -> list[OrtProvider]:
    """The providers that run off the host, in `auto`'s order of preference."""
    return [record for record in PROVIDERS.values() if not record.on_host]


def setting_choices() -> str:
    """What a provider setting accepts, in words: `auto, cann, cuda or cpu`."""
    *rest, last = ["auto", *PROVIDERS]
    return f"{', '.join(rest)} or {last}"
