"""The record every execution backend is, and the few types the records share.

A backend (ONNX Runtime, OpenVINO, …) is one `Backend` record in `retrieval/backends/__init__.py`'s
registry: how to tell whether it is here, which devices it has, which run precisions it offers for
the graphs a model directory holds, whether its sessions can share one copy of a tower's weights,
and how to open a session for one fixed-shape graph. Code outside `retrieval/backends/` asks the
record; it never compares a backend's or a device's name (adding a backend is one module plus one
registry line, see docs/backends.md).

Names used throughout:
- *graph variant*: the graphs a model directory holds per precision (`fp32`, `fp16`, `int8` —
  ONNX Runtime's dynamic quantization — and `int8-qdq`, NNCF's calibrated static int8);
- *run precision*: what the engine computes in (`fp32`, `fp16`, `bf16`, `int8`); a backend maps
  each run precision it offers to the graph variant it opens (OpenVINO's `bf16` runs the `fp32`
  graph with its inference precision set to bf16).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

# Defined in the stdlib-only provider registry (a Triton model loads that file on its own); shared by all.
from retrieval.backends.ort_providers import Detection as Detection

if TYPE_CHECKING:
    from retrieval.shared_weights import SharedWeights

RUN_PRECISIONS = ("fp32", "fp16", "bf16", "int8")


@dataclass(frozen=True)
class DeviceChoice:
    """The device a backend runs on (ONNX Runtime: cpu|cuda|cann; OpenVINO: CPU|GPU|NPU) and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class SessionConfig:
    """Everything needed to open one session of one stream, whatever the backend.

    `provider` is the device within the backend (the name is ONNX Runtime's, kept for its callers);
    `precision` the graph variant opened; `run_precision` what the engine is told to compute in
    (None: the graph's own types)."""

    provider: str
    precision: str
    device_id: int = 0
    cores: list[int] = field(default_factory=list)  # CPU: this stream's cores (len = intra-op threads)
    pin_threads: bool = False
    spin: bool = True  # False: the threads stop spinning when a run ends (the cores go on to others)
    # The tower's weights, shared by all of its sessions (see retrieval/shared_weights.py); None:
    # each session loads, prepacks and keeps its own copy.
    weights: SharedWeights | None = field(default=None, compare=False, repr=False)
    backend: str = "onnxruntime"
    run_precision: str | None = None
    # ONNX Runtime on the CPU: the stream's graphs of a tower run on one shape-dynamic session with
    # its own prepacked weights (retrieval/backends/ort_batch.py) instead of a session per bucket.
    dynamic_shapes: bool = False
    # What a backend compiles once for this stream and shares among its shapes (OpenVINO: one
    # shape-dynamic model per tower, retrieval/backends/openvino.py). Not an argument: every
    # config — one per stream — starts with its own, so streams never share a compiled model.
    stream_models: dict[Any, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def unshared(self) -> SessionConfig:
        """The same configuration, with the session loading (and prepacking) its own copy of the weights."""
        return dataclasses.replace(self, weights=None, dynamic_shapes=False)


class EngineSession(Protocol):
    """One fixed-shape graph opened by a backend (a `retrieval.sessions.ModelSession` plus what it reports)."""

    # What the engine says it computes in (OpenVINO's compiled INFERENCE_PRECISION_HINT), or the graph's.
    engine_precision: str

    def run(self, batch: np.ndarray) -> np.ndarray: ...


SessionOpener = Callable[[Path, SessionConfig, str, str], Any]


@dataclass(frozen=True)
class Backend:
    """One execution backend: a record, not a class hierarchy (see the module docstring).

    - `detect()`: whether the engine is installed and usable here, and why (never raises);
    - `choose_device(requested)`: the device for a setting (`auto` or a device name); raises
      `EncoderUnavailable` when an explicit device is not there;
    - `precisions(device, graphs)`: run precision → graph variant, for the variants a tower has,
      in the backend's order of preference for `auto` (fastest safe first);
    - `shares_weights(device)`: whether its sessions can read one shared copy of a tower's weights;
    - `uses_cpu_cores(device)`: whether sessions run on host cores (streams get core shares);
    - `open_session(path, config, input, output)`: an `EngineSession`;
    - `version()`: the engine's version for the tuning fingerprint (None when absent);
    - `errors()`: the engine's own exception types (a warm-up failure is reported, not a crash);
    - `variants`: the graph variants it can open at all (what `cnclip tune` and the gate look for);
    - `device_setting`: the `RuntimeSettings` field that names its device (`provider`, `openvino_device`);
    - `devices`: the device kinds it knows (ONNX Runtime: its providers; OpenVINO: CPU, GPU, NPU);
    - `host_device`: the device that is always there, the host CPU (the quality gate's reference runs on it);
    - `triton_kind(device)`: Triton's instance kind for a device (`KIND_CPU`, `KIND_GPU`; `KIND_MODEL`
      where Triton has none), for the `/v2` model configuration.
    - `shapes_share_a_copy(device)`: whether a stream's sessions of one tower (every batch bucket and
      text length) hold one copy together (OpenVINO's CPU: one shape-dynamic compiled model), so the
      memory budget counts one copy per stream instead of one per shape.
    - `dynamic_sessions(device)`: whether it can run a stream's shapes of a tower on one shape-dynamic
      session when `CNCLIP_DYNAMIC_SHAPES` asks (ONNX Runtime's CPU: `SessionConfig.dynamic_shapes`).
    """

    name: str
    summary: str
    device_setting: str
    detect: Callable[[], Detection]
    choose_device: Callable[[str], DeviceChoice]
    precisions: Callable[[str, Sequence[str]], Mapping[str, str]]
    shares_weights: Callable[[str], bool]
    uses_cpu_cores: Callable[[str], bool]
    open_session: SessionOpener
    version: Callable[[], str | None]
    errors: Callable[[], tuple[type[BaseException], ...]]
    variants: tuple[str, ...]
    devices: tuple[str, ...]
    host_device: str
    triton_kind: Callable[[str], str]
    shapes_share_a_copy: Callable[[str], bool] = lambda device: False
    dynamic_sessions: Callable[[str], bool] = lambda device: False


def cpu_thread_plan(streams: int, threads_per_stream: int, cores: int | None = None) -> list[list[int]]:
    """The cores of each stream: `threads_per_stream` each (0 = an equal share), wrapping around."""
    cores = cores or len(os.sched_getaffinity(0))
    per_stream = threads_per_stream or max(1, cores // streams)
    return [[(s * per_stream + i) % cores for i in range(per_stream)] for s in range(streams)]
