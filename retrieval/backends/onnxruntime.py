"""ONNX Runtime as a backend: its execution providers (CANN, CUDA, CPU), session options, sessions.

The providers are records in `retrieval/backends/ort_providers.py` (names, options, detection, the
order of precisions); this module chooses one and opens sessions with it, and never names one.

The hardware is detected *before* ONNX Runtime is asked: `onnxruntime-cann` always lists
`CANNExecutionProvider`, and creating a session with it on a host without the CANN toolkit prints
an EP error and falls back silently. So `auto` checks for the toolkit and a visible device
itself, picks one provider, and logs one line saying which and why.

Run precisions are the graph variants themselves: `int8` (dynamic quantization, `cnclip convert`'s
default int8), `fp32`, and `fp16` for NPU/GPU. ONNX Runtime's CPU provider has no bf16 kernels, and
it runs calibrated static int8 (`int8-qdq`) slower than dynamic int8, so it offers neither.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.backends.base import Backend, Detection, DeviceChoice, SessionConfig
from retrieval.backends.ort_providers import ASCEND_DEFAULT_HOME as ASCEND_DEFAULT_HOME
from retrieval.backends.ort_providers import HOST, PROVIDERS, OrtProvider, accelerators, provider_named, setting_choices
from retrieval.backends.ort_providers import detect_ascend as detect_ascend
from retrieval.backends.ort_providers import detect_cuda as detect_cuda
from retrieval.errors import EncoderUnavailable, ModelError

log = logging.getLogger(__name__)
# OrtSession's warnings keep the logger they had before the move (operators filter on it).
session_log = logging.getLogger("retrieval.sessions")


def _ort_available() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def _provider(name: str) -> OrtProvider:
    """The registry's record for `name`; an unknown name is a `ModelError` listing the known ones."""
    try:
        return provider_named(name)
    except ValueError as exc:
        raise ModelError(str(exc)) from None


def choose_provider(
    requested: str, available: Callable[[], list[str]] = _ort_available, **detect: Callable[[], Detection]
) -> DeviceChoice:
    """Resolve `auto` or a provider's name to one provider; an explicit choice that cannot work is an error.

    `detect` replaces a provider's own hardware detection, by provider name (tests: `cann=lambda: …`)."""
    if requested != "auto" and requested not in PROVIDERS:
        raise ModelError(f"unknown provider {requested!r}; use {setting_choices()}")
    ort_providers = available()
    if requested != "auto":
        record = PROVIDERS[requested]
        if record.on_host:
            return DeviceChoice(record.name, f"CNCLIP_PROVIDER={requested}")
        if record.ort_name not in ort_providers:
            raise EncoderUnavailable(
                f"CNCLIP_PROVIDER={requested} but this onnxruntime build has no {record.ort_name} "
                f"(it has {', '.join(ort_providers)})"
            )
        found = detect.get(record.name, record.detect)()
        if not found.found:
            raise EncoderUnavailable(f"CNCLIP_PROVIDER={requested} but {found.reason}")
        return DeviceChoice(requested, f"CNCLIP_PROVIDER={requested}: {found.reason}")
    reasons = []
    for record in accelerators():
        if record.ort_name not in ort_providers:
            reasons.append(f"onnxruntime has no {record.ort_name}")
            continue
        found = detect.get(record.name, record.detect)()
        if found.found:
            return DeviceChoice(record.name, f"auto: {found.reason}")
        reasons.append(found.reason)
    return DeviceChoice(HOST.name, "auto: " + "; ".join(reasons))


def _preference(provider: str) -> tuple[str, ...]:
    return _provider(provider).precisions


def choose_precision(provider: str, requested: str, available: Sequence[str]) -> str:
    """NPU/GPU: fp16 graphs (else fp32); CPU: int8 when the model has it, else fp32. A setting overrides."""
    if requested != "auto":
        if requested not in available:
            raise ModelError(
                f"CNCLIP_PRECISION={requested} but the model directory only has {', '.join(available)} graphs"
            )
        return requested
    for precision in _preference(provider):
        if precision in available:
            return precision
    raise ModelError("the model directory has no graphs")


def run_precisions(provider: str, graphs: Sequence[str]) -> dict[str, str]:
    """Run precision -> graph variant, in `auto`'s order: the graph variants themselves."""
    return {p: p for p in _preference(provider) if p in graphs}


def weight_sharing(provider: str, enabled: bool) -> tuple[bool, str]:
    """Whether a tower's bucket sessions share one copy of its weights, and why (logged at start-up).

    CPU only: there the copies are host memory that sharing can remove. On CUDA/CANN each session
    holds its weights in device memory whatever the host does, and a shared host buffer handed to
    those providers is a path this project cannot test; they keep ONNX Runtime's default."""
    if not enabled:
        return False, "not shared (CNCLIP_SHARE_WEIGHTS=false): each bucket session has its own prepacked copy"
    if not _provider(provider).on_host:
        return False, f"not shared on {provider}: each session keeps its own copy in device memory"
    return True, "one copy per tower and precision, mapped from its data file (prepacking and per-session arenas off)"


def ort_providers(config: SessionConfig) -> list[tuple[str, dict[str, str]] | str]:
    """The `providers=` argument for `ort.InferenceSession`, accelerator first, CPU as fallback."""
    return _provider(config.provider).session_providers(config.device_id)


def ort_session_options(config: SessionConfig) -> Any:
    """`ort.SessionOptions` for one stream: its threads, spinning, affinity, and weight sharing."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # ORT's warnings about unused initializers are noise here
    if _provider(config.provider).on_host and config.cores:
        options.intra_op_num_threads = len(config.cores)
        if not config.spin:
            # Several streams share the cores: spinning workers would steal them from each other.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if config.pin_threads and len(config.cores) > 1:
            # ORT pins the pool's extra threads (the calling thread is pinned by the stream itself);
            # logical processor ids are 1-based, one ';'-separated entry per extra thread.
            affinities = ";".join(str(core + 1) for core in config.cores[1:])
            options.add_session_config_entry("session.intra_op_thread_affinities", affinities)
    if config.weights is not None:
        # Prepacking would give every session a private re-laid-out copy of each weight, and
        # a per-session arena keeps its largest run's activations for good: with N bucket
        # sessions, N copies and N peaks. Without an arena, activations go back after each run.
        options.add_session_config_entry("session.disable_prepacking", "1")
        options.enable_cpu_mem_arena = False
    return options


def ort_errors() -> tuple[type[BaseException], ...]:
    """ONNX Runtime's own exception types (they do not share a base class below Exception)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state
    except ImportError:
        return ()
    names = (
        "Fail",
        "InvalidArgument",
        "InvalidGraph",
        "InvalidProtobuf",
        "NoSuchFile",
        "NoModel",
        "EPFail",
        "RuntimeException",
        "NotImplemented",
        "EngineError",
        "ModelRequiresCompilation",
    )
    return tuple(getattr(state, n) for n in names if hasattr(state, n))


class OrtSession:
    """A `ModelSession` over one ONNX Runtime `InferenceSession`.

    With `config.weights` the session reads the tower's shared weights; if they cannot be handed
    over, or ONNX Runtime refuses the session with them, it says so once and loads its own copy."""

    def __init__(self, path: Path, config: SessionConfig, input_name: str, output_name: str) -> None:
        # The session reads the shared weights' mapped buffers: they must live as long as it does.
        self.weights = config.weights if config.weights is not None and config.weights.usable else None
        if self.weights is not None:
            try:
                self._session = self._open(path, config)
                self.weights.record_session()
            except (OSError, ValueError, ModelError) as exc:
                self.weights.give_up(f"{path.name}: {exc}")
                session_log.warning(
                    "%s: cannot share weights, each session loads its own copy: %s", self.weights.label, exc
                )
                self.weights = None
        if self.weights is None:
            self._session = self._open(path, config.unshared())
        self.input_name = input_name
        self.output_name = output_name
        self.providers = self._session.get_providers()
        # ONNX Runtime computes in the graph's own types: an int8 graph's matmuls are int8, the rest fp32.
        self.engine_precision = config.precision

    @staticmethod
    def _open(path: Path, config: SessionConfig) -> Any:
        import onnxruntime as ort

        errors: tuple[type[BaseException], ...] = (RuntimeError, *ort_errors())
        try:
            options = ort_session_options(config)
            if config.weights is not None:
                config.weights.add_to(options, path)
            return ort.InferenceSession(str(path), sess_options=options, providers=ort_providers(config))
        except errors as exc:
            raise ModelError(f"cannot open graph {path}: {exc}") from exc

    def run(self, batch: np.ndarray) -> np.ndarray:
        return self._session.run([self.output_name], {self.input_name: batch})[0]


def _detect() -> Detection:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return Detection(False, f"onnxruntime is not installed ({exc})")
    return Detection(True, f"onnxruntime {ort.__version__} with {', '.join(ort.get_available_providers())}")


def _version() -> str | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    return str(ort.__version__)


ONNXRUNTIME = Backend(
    name="onnxruntime",
    device_setting="provider",
    summary="ONNX Runtime: CPU, CUDA and Ascend CANN execution providers",
    detect=_detect,
    choose_device=lambda requested: choose_provider(requested),
    precisions=run_precisions,
    shares_weights=lambda provider: _provider(provider).on_host,
    uses_cpu_cores=lambda provider: _provider(provider).on_host,
    open_session=OrtSession,
    version=_version,
    errors=ort_errors,
    variants=("fp32", "fp16", "int8"),
    devices=tuple(PROVIDERS),
    host_device=HOST.name,
    triton_kind=lambda provider: _provider(provider).triton_kind,
)
