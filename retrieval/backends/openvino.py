"""OpenVINO as a backend (the optional `openvino` extra): the same ONNX graphs, compiled by OpenVINO.

OpenVINO reads the model directory's ONNX graphs directly (external weight files included), so a
model needs no second format; its calibrated static int8 graphs (`int8-qdq`, NNCF, written by
`cnclip convert --precision int8-qdq`) are ONNX too. Each bucket graph is compiled on its own: a
compiled model re-lays its weights out for its kernels, so OpenVINO's sessions never share one copy
(the memory budget counts each of them).

OpenVINO picks its own inference precision: on a CPU with AVX512_BF16 or AMX it runs an fp32 graph
in bf16 unless told otherwise. So every session sets INFERENCE_PRECISION_HINT itself — f32 for
`fp32` and for the float parts of `int8`, bf16 for `bf16`, f16 for `fp16` on a GPU/NPU — and reads
it back from the compiled model: the start-up log line says what the engine reports, not what was
asked. Devices: CPU always; GPU and NPU where OpenVINO lists them (never required).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.backends.base import Backend, Detection, DeviceChoice, SessionConfig
from retrieval.backends.ort_providers import KIND_MODEL
from retrieval.errors import EncoderUnavailable, ModelError

log = logging.getLogger(__name__)

DEVICES = ("CPU", "GPU", "NPU")
HOST_DEVICE = DEVICES[0]
# The element type OpenVINO is told to compute in, per run precision (int8: the float parts stay f32).
HINTS = {"fp32": "f32", "int8": "f32", "bf16": "bf16", "fp16": "f16"}


@functools.cache
def _core() -> Any:
    """One OpenVINO Core per process (it holds the plugins; creating one loads them)."""
    import openvino as ov

    return ov.Core()


def _detect() -> Detection:
    try:
        devices = list(_core().available_devices)
    except ImportError as exc:
        return Detection(False, f"openvino is not installed (pip install 'cnclip-search[openvino]'): {exc}")
    except RuntimeError as exc:  # a broken plugin install
        return Detection(False, f"openvino cannot start: {exc}")
    return Detection(True, f"openvino {_version()} with devices {', '.join(devices) or 'none'}")


def _version() -> str | None:
    try:
        import openvino as ov
    except ImportError:
        return None
    return str(ov.get_version()).split("-", 1)[0]


def _device_kind(device: str) -> str:
    """ "GPU.1" -> "GPU"."""
    return device.split(".", 1)[0].upper()


def choose_device(requested: str) -> DeviceChoice:
    """`auto` runs on the CPU (always there) and names the others it saw; an explicit device must be listed."""
    found = _detect()
    if not found.found:
        raise EncoderUnavailable(f"CNCLIP_BACKEND=openvino but {found.reason}")
    available = list(_core().available_devices)
    if requested.lower() == "auto":
        others = [d for d in available if _device_kind(d) != HOST_DEVICE]
        seen = f"; also present: {', '.join(others)} (CNCLIP_OPENVINO_DEVICE picks one)" if others else ""
        return DeviceChoice(HOST_DEVICE, f"auto: the CPU{seen}")
    wanted = requested.upper()
    if _device_kind(wanted) not in DEVICES or wanted not in available:
        raise EncoderUnavailable(
            f"CNCLIP_OPENVINO_DEVICE={requested} but OpenVINO lists only {', '.join(available) or 'no device'}"
        )
    return DeviceChoice(wanted, f"CNCLIP_OPENVINO_DEVICE={requested}")


def capabilities(device: str) -> set[str]:
    """What the device computes natively, as OpenVINO reports it (e.g. {"FP32", "BF16", "INT8"})."""
    try:
        return {str(c).upper() for c in _core().get_property(device, "OPTIMIZATION_CAPABILITIES")}
    except (ImportError, RuntimeError):
        return set()


def run_precisions(device: str, graphs: Sequence[str]) -> dict[str, str]:
    """Run precision -> graph variant, in `auto`'s order of preference.

    Calibrated int8 first (it passed the gate at conversion or it would not be in the model). On a
    GPU/NPU then fp16, which they compute natively. On a CPU fp32 comes before bf16: bf16 rounds
    every activation and `auto` takes it only from a tuning file, where the gate ran on this CPU;
    it is offered only where OpenVINO says the CPU computes it natively (AVX512_BF16, AMX)."""
    native = capabilities(device)
    offered: dict[str, str] = {}
    if "int8-qdq" in graphs and "INT8" in native:
        offered["int8"] = "int8-qdq"
    if "fp32" in graphs:
        if "FP16" in native and _device_kind(device) != HOST_DEVICE:
            offered["fp16"] = "fp32"
        offered["fp32"] = "fp32"
        if "BF16" in native and _device_kind(device) == HOST_DEVICE:
            offered["bf16"] = "fp32"
    return offered


def compile_properties(config: SessionConfig) -> dict[str, Any]:
    """The compile-time properties of one stream's session: precision pinned, one stream, its threads."""
    run = config.run_precision or "fp32"
    properties: dict[str, Any] = {
        "INFERENCE_PRECISION_HINT": HINTS[run],
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,  # our streams are separate compiled models, each driven by its own thread
    }
    if _device_kind(config.provider) == HOST_DEVICE:
        if config.cores:
            properties["INFERENCE_NUM_THREADS"] = len(config.cores)
        properties["ENABLE_CPU_PINNING"] = bool(config.pin_threads)
    return properties


class OpenVinoSession:
    """A `ModelSession` over one compiled OpenVINO model and its infer request."""

    def __init__(self, path: Path, config: SessionConfig, input_name: str, output_name: str) -> None:
        core = _core()
        try:
            compiled = core.compile_model(core.read_model(str(path)), config.provider, compile_properties(config))
        except RuntimeError as exc:
            raise ModelError(f"OpenVINO cannot compile {path.name} for {config.provider}: {exc}") from exc
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self.input_name = input_name
        self.output_name = output_name
        self.providers = [f"OpenVINO {config.provider}"]
        reported = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        # int8 graphs: the quantized matmuls run int8; the engine's hint is the precision of the rest.
        self.engine_precision = f"int8 (rest {reported})" if config.run_precision == "int8" else reported

    def run(self, batch: np.ndarray) -> np.ndarray:
        self._request.infer({self.input_name: batch}, share_inputs=True)
        # The output tensor is the request's own buffer, reused by the next run: copy it out.
        return np.array(self._request.get_tensor(self.output_name).data, dtype=np.float32, copy=True)


OPENVINO = Backend(
    name="openvino",
    device_setting="openvino_device",
    summary="OpenVINO: CPU (fp32, bf16 where the CPU has it, NNCF int8), and its GPU/NPU devices where present",
    detect=_detect,
    choose_device=choose_device,
    precisions=run_precisions,
    shares_weights=lambda device: False,
    uses_cpu_cores=lambda device: _device_kind(device) == HOST_DEVICE,
    open_session=OpenVinoSession,
    version=_version,
    errors=lambda: (RuntimeError,),
    variants=("fp32", "int8-qdq"),
    devices=DEVICES,
    host_device=HOST_DEVICE,
    # Its CPU is Triton's KIND_CPU; Triton's KIND_GPU means a CUDA GPU, so OpenVINO's GPU/NPU are KIND_MODEL.
    triton_kind=lambda device: "KIND_CPU" if _device_kind(device) == HOST_DEVICE else KIND_MODEL,
)
