"""OpenVINO as a backend (the optional `openvino` extra): the same ONNX graphs, compiled by OpenVINO.

OpenVINO reads the model directory's ONNX graphs directly (external weight files included), so a
model needs no second format; its calibrated static int8 graphs (`int8-qdq`, NNCF, written by
`cnclip convert --precision int8-qdq`) are ONNX too. A compiled model re-lays its weights out for
its kernels, so compiled per bucket every shape held its own copy (six text shapes of ViT-B-16 int8:
1,785 MB, issue 34). On the CPU a stream's bucket graphs of a tower are therefore compiled once, as
one model with a bounded dynamic batch and text length (retrieval/backends/openvino_batch.py), and
each bucket session drives its own infer request on it: one copy per stream and tower, which runs
any batch size up to the largest bucket unpadded and a text at its own width, as ONNX Runtime's one
session does (a padded batch of 5 in bucket 8 computed 3 rows for nothing). Compiling
waits for the first run, when the stream has opened all of its shapes; graphs that are not one graph
are compiled per text length, else per bucket, as before, with one log line. The weight file
OpenVINO keeps mapped goes back to the page cache after a shape's first run (mapped_weights.py).

OpenVINO picks its own inference precision: on a CPU with AVX512_BF16 or AMX it runs an fp32 graph
in bf16 unless told otherwise. So every session sets INFERENCE_PRECISION_HINT itself — f32 for
`fp32` and for the float parts of `int8`, bf16 for `bf16`, f16 for `fp16` on a GPU/NPU — and reads
it back from the compiled model: the start-up log line says what the engine reports, not what was
asked. Devices: CPU always; GPU and NPU where OpenVINO lists them (never required).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.backends.base import Backend, Detection, DeviceChoice, SessionConfig
from retrieval.backends.bucket_shapes import any_batch_up_to, any_length_up_to
from retrieval.backends.mapped_weights import release_resident
from retrieval.backends.openvino_batch import NotBatchLinear, dynamic_model
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


class StreamGraphs:
    """The graphs one stream opened for one tower, and the compiled models that serve them.

    Registered at open, compiled at the first run (by then the stream has opened every shape): on
    the CPU the tower's graphs become one shape-dynamic compiled model (`dynamic_model`), else one
    per text length; what cannot, a graph opened after that first run, or another device compiles
    each graph on its own."""

    def __init__(self, config: SessionConfig) -> None:
        # A copy without the registry that holds this object: no reference cycle, so the compiled
        # models go with the stream's last session, not at some later garbage collection (the
        # quality gate grew 735 MB per OpenVINO shape opened: 19.4 GB converting ViT-B-16).
        self.config = dataclasses.replace(config)
        self.paths: list[Path] = []
        self.compiled: dict[Path, Any] = {}
        self.bounds: dict[Path, list[tuple[int, int]]] = {}  # a shape-dynamic model's (least, most) bucket per axis
        self._lock = threading.Lock()  # streams are single-threaded; this only guards a misuse

    @classmethod
    def of(cls, config: SessionConfig, path: Path, input_name: str) -> StreamGraphs:
        return config.stream_models.setdefault(("openvino", path.parent, input_name), cls(config))  # type: ignore[no-any-return]

    def add(self, path: Path) -> None:
        if not path.is_file():
            raise ModelError(f"OpenVINO cannot open {path}: no such graph file")
        with self._lock:
            self.paths.append(path)

    def compiled_for(self, path: Path) -> Any:
        with self._lock:
            if path not in self.compiled:
                self._compile([p for p in dict.fromkeys(self.paths) if p not in self.compiled])
            return self.compiled[path]

    def any_batch_up_to(self, path: Path) -> int:
        self.compiled_for(path)
        return any_batch_up_to(self.bounds.get(path, []))

    def any_length_up_to(self, path: Path) -> int:
        self.compiled_for(path)
        return any_length_up_to(self.bounds.get(path, []))

    def _compile(self, pending: list[Path]) -> None:
        core = _core()
        models = {p: _read(core, p) for p in pending}
        shapes = {p: _static_shape(m) for p, m in models.items()}
        alone = [p for p in pending if shapes[p] is None or list(shapes.values()).count(shapes[p]) > 1]
        # Widest first: every graph of one input type and rank (text: all batches and lengths), then
        # those that differ only in the batch (one per text length), then each graph on its own.
        widest = _grouped(
            [p for p in pending if p not in alone], lambda p: (_input_type(models[p]), len(shapes[p] or ()))
        )
        for group in widest:
            if len(group) > 1 and _device_kind(self.config.provider) == HOST_DEVICE:
                alone += self._compile_shared(core, group, models, shapes)
            else:
                alone += group
        for path in alone:
            self.compiled[path] = _compile(core, models[path], self.config, path)

    def _compile_shared(
        self, core: Any, group: list[Path], models: dict[Path, Any], shapes: dict[Path, Any]
    ) -> list[Path]:
        """Compile `group` as one model, else per shape bar the batch; returns the graphs left to compile alone."""
        by_rest = _grouped(group, lambda p: shapes[p][1:])
        for groups in [[group], by_rest] if len(by_rest) > 1 else [[group]]:
            left: list[Path] = []
            for part in groups:
                if len(part) < 2:
                    left += part
                    continue
                names = ", ".join(p.name for p in part)
                try:
                    rewrite = dynamic_model({shapes[p]: models[p] for p in part})
                    compiled = _compile(core, rewrite.model, self.config, part[0])
                except (NotBatchLinear, ModelError, RuntimeError) as exc:
                    log.info("openvino: %s cannot share one compiled model (%s)", names, exc)
                    models.update({p: _read(core, p) for p in part})  # untouched copies for what comes next
                    left += part
                    continue
                if rewrite.recalibrated:
                    log.info("openvino: %s were calibrated apart; all run the calibration of the %s graph (%d constants)",
                             names, list(rewrite.base_shape), rewrite.recalibrated)  # fmt: skip
                self.compiled.update(dict.fromkeys(part, compiled))
                self.bounds.update(dict.fromkeys(part, rewrite.bounds))
            if len(left) < len(group):
                return left
        return group


def _static_shape(model: Any) -> tuple[int, ...] | None:
    shape = model.inputs[0].get_partial_shape()
    return None if shape.is_dynamic else tuple(int(d) for d in shape.to_shape())


def _input_type(model: Any) -> str:
    return str(model.inputs[0].get_element_type().get_type_name())


def _grouped(paths: list[Path], key: Any) -> list[list[Path]]:
    groups: dict[Any, list[Path]] = {}
    for path in paths:
        groups.setdefault(key(path), []).append(path)
    return list(groups.values())


def _read(core: Any, path: Path) -> Any:
    try:
        return core.read_model(str(path))
    except RuntimeError as exc:
        raise ModelError(f"OpenVINO cannot read {path.name}: {exc}") from exc


def _compile(core: Any, model: Any, config: SessionConfig, path: Path) -> Any:
    try:
        return core.compile_model(model, config.provider, compile_properties(config))
    except RuntimeError as exc:
        raise ModelError(f"OpenVINO cannot compile {path.name} for {config.provider}: {exc}") from exc


class OpenVinoSession:
    """A `ModelSession` over one bucket graph: its own infer request on the stream's compiled model."""

    def __init__(self, path: Path, config: SessionConfig, input_name: str, output_name: str) -> None:
        self._graphs = StreamGraphs.of(config, path, input_name)
        self._graphs.add(path)
        self._path = path
        self._run_precision = config.run_precision
        self._request: Any = None
        self.input_name = input_name
        self.output_name = output_name
        self.providers = [f"OpenVINO {config.provider}"]

    @property
    def compiled_model(self) -> Any:
        """The compiled model this session's infer request runs on (shared by the stream's batch buckets)."""
        return self._graphs.compiled_for(self._path)

    def any_batch_up_to(self) -> int:
        """The most rows this graph's session runs at any batch size from 1, unpadded (one
        shape-dynamic model per stream); 0 where it runs its own bucket's size only."""
        return self._graphs.any_batch_up_to(self._path)

    def any_length_up_to(self) -> int:
        """The longest text this graph's session runs at any width; 0: its own bucket's length only."""
        return self._graphs.any_length_up_to(self._path)

    def _ready(self) -> Any:
        if self._request is None:
            self._request = self.compiled_model.create_infer_request()
        return self._request

    @property
    def engine_precision(self) -> str:
        """What the compiled model reports computing in (compiles it if no run has yet)."""
        reported = self.compiled_model.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        # int8 graphs: the quantized matmuls run int8; the engine's hint is the precision of the rest.
        return f"int8 (rest {reported})" if self._run_precision == "int8" else str(reported)

    def run(self, batch: np.ndarray) -> np.ndarray:
        first = self._request is None
        request = self._ready()
        request.infer({self.input_name: batch}, share_inputs=True)
        if first:
            # Compiling, and a shape's first run, read the whole weight file; the compiled model runs
            # from its own copy, so the file's pages go back to the page cache (mapped_weights.py).
            release_resident([self._path.parent])
        # The output tensor is the request's own buffer, reused by the next run: copy it out.
        return np.array(request.get_tensor(self.output_name).data, dtype=np.float32, copy=True)


OPENVINO = Backend(
    name="openvino",
    device_setting="openvino_device",
    summary="OpenVINO: CPU (fp32, bf16 where the CPU has it, NNCF int8), and its GPU/NPU devices where present",
    detect=_detect,
    choose_device=choose_device,
    precisions=run_precisions,
    shares_weights=lambda device: False,
    shapes_share_a_copy=lambda device: _device_kind(device) == HOST_DEVICE,
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
