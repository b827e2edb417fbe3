"""Which ONNX Runtime execution provider and graph precision to use, and how to configure them.

The hardware is detected *before* ONNX Runtime is asked: `onnxruntime-cann` always lists
`CANNExecutionProvider`, and creating a session with it on a host without the CANN toolkit prints
an EP error and falls back silently. So `auto` checks for the toolkit and a visible device
itself, picks one provider, and logs one line saying which and why.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import glob
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retrieval.errors import EncoderUnavailable, ModelError

if TYPE_CHECKING:
    from retrieval.shared_weights import SharedWeights

log = logging.getLogger(__name__)

ORT_PROVIDER = {"cann": "CANNExecutionProvider", "cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}
ASCEND_DEFAULT_HOME = Path("/usr/local/Ascend")


@dataclass(frozen=True)
class Detection:
    """The outcome of looking for one kind of accelerator, with the reason in words."""

    found: bool
    reason: str


@dataclass(frozen=True)
class ProviderChoice:
    name: str  # "cann" | "cuda" | "cpu"
    reason: str


def _ort_available() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


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


def choose_provider(
    requested: str,
    available: Callable[[], list[str]] = _ort_available,
    ascend: Callable[[], Detection] = detect_ascend,
    cuda: Callable[[], Detection] = detect_cuda,
) -> ProviderChoice:
    """Resolve `auto|cann|cuda|cpu` to one provider; an explicit choice that cannot work is an error."""
    ort_providers = available()
    if requested == "cpu":
        return ProviderChoice("cpu", "CNCLIP_PROVIDER=cpu")
    if requested in ("cann", "cuda"):
        if ORT_PROVIDER[requested] not in ort_providers:
            raise EncoderUnavailable(
                f"CNCLIP_PROVIDER={requested} but this onnxruntime build has no {ORT_PROVIDER[requested]} "
                f"(it has {', '.join(ort_providers)})"
            )
        found = (ascend if requested == "cann" else cuda)()
        if not found.found:
            raise EncoderUnavailable(f"CNCLIP_PROVIDER={requested} but {found.reason}")
        return ProviderChoice(requested, f"CNCLIP_PROVIDER={requested}: {found.reason}")
    if requested != "auto":
        raise ModelError(f"unknown provider {requested!r}; use auto, cann, cuda or cpu")
    reasons = []
    for name, detect in (("cann", ascend), ("cuda", cuda)):
        if ORT_PROVIDER[name] not in ort_providers:
            reasons.append(f"onnxruntime has no {ORT_PROVIDER[name]}")
            continue
        found = detect()
        if found.found:
            return ProviderChoice(name, f"auto: {found.reason}")
        reasons.append(found.reason)
    return ProviderChoice("cpu", "auto: " + "; ".join(reasons))


def choose_precision(provider: str, requested: str, available: Sequence[str]) -> str:
    """NPU/GPU: fp16 graphs (else fp32); CPU: int8 when the model has it, else fp32. A setting overrides."""
    if requested != "auto":
        if requested not in available:
            raise ModelError(
                f"CNCLIP_PRECISION={requested} but the model directory only has {', '.join(available)} graphs"
            )
        return requested
    preference = ("fp16", "fp32", "int8") if provider in ("cann", "cuda") else ("int8", "fp32", "fp16")
    for precision in preference:
        if precision in available:
            return precision
    raise ModelError("the model directory has no graphs")


def cpu_thread_plan(streams: int, threads_per_stream: int, cores: int | None = None) -> list[list[int]]:
    """The cores of each stream: `threads_per_stream` each (0 = an equal share), wrapping around."""
    cores = cores or len(os.sched_getaffinity(0))
    per_stream = threads_per_stream or max(1, cores // streams)
    return [[(s * per_stream + i) % cores for i in range(per_stream)] for s in range(streams)]


def weight_sharing(provider: str, enabled: bool) -> tuple[bool, str]:
    """Whether a tower's bucket sessions share one copy of its weights, and why (logged at start-up).

    CPU only: there the copies are host memory that sharing can remove. On CUDA/CANN each session
    holds its weights in device memory whatever the host does, and a shared host buffer handed to
    those providers is a path this project cannot test; they keep ONNX Runtime's default."""
    if not enabled:
        return False, "not shared (CNCLIP_SHARE_WEIGHTS=false): each bucket session has its own prepacked copy"
    if provider != "cpu":
        return False, f"not shared on {provider}: each session keeps its own copy in device memory"
    return True, "one copy per tower and precision, mapped from its data file (prepacking and per-session arenas off)"


@dataclass(frozen=True)
class SessionConfig:
    """Everything needed to open one ONNX Runtime session for one stream."""

    provider: str
    precision: str
    device_id: int = 0
    cores: list[int] = field(default_factory=list)  # CPU: this stream's cores (len = intra-op threads)
    pin_threads: bool = False
    spin: bool = True
    # The tower's weights, shared by all of its sessions (see retrieval/shared_weights.py); None:
    # each session loads, prepacks and keeps its own copy.
    weights: SharedWeights | None = field(default=None, compare=False, repr=False)

    def unshared(self) -> SessionConfig:
        """The same configuration, with the session loading its own copy of the weights."""
        return dataclasses.replace(self, weights=None)

    def providers(self) -> list[tuple[str, dict[str, Any]] | str]:
        """The `providers=` argument for `ort.InferenceSession`, accelerator first, CPU as fallback."""
        if self.provider == "cann":
            options = {
                "device_id": str(self.device_id),
                # One static model per input shape, compiled once at warm-up: why buckets are fixed.
                "enable_cann_graph": "1",
                # CANN defaults to force_fp16; keep each graph's own dtypes (fp32 stays fp32, fp16 is fp16).
                "precision_mode": "must_keep_origin_dtype",
            }
            return [("CANNExecutionProvider", options), "CPUExecutionProvider"]
        if self.provider == "cuda":
            return [("CUDAExecutionProvider", {"device_id": str(self.device_id)}), "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def session_options(self) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # ORT's warnings about unused initializers are noise here
        if self.provider == "cpu" and self.cores:
            options.intra_op_num_threads = len(self.cores)
            if not self.spin:
                # Several streams share the cores: spinning workers would steal them from each other.
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            if self.pin_threads and len(self.cores) > 1:
                # ORT pins the pool's extra threads (the calling thread is pinned by the stream itself);
                # logical processor ids are 1-based, one ';'-separated entry per extra thread.
                affinities = ";".join(str(core + 1) for core in self.cores[1:])
                options.add_session_config_entry("session.intra_op_thread_affinities", affinities)
        if self.weights is not None:
            # Prepacking would give every session a private re-laid-out copy of each weight, and
            # a per-session arena keeps its largest run's activations for good: with N bucket
            # sessions, N copies and N peaks. Without an arena, activations go back after each run.
            options.add_session_config_entry("session.disable_prepacking", "1")
            options.enable_cpu_mem_arena = False
        return options
