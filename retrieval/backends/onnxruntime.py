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

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from google.protobuf.message import DecodeError

from retrieval.backends.base import Backend, Detection, DeviceChoice, SessionConfig
from retrieval.backends.bucket_shapes import any_batch_up_to, any_length_up_to
from retrieval.backends.ort_batch import NotBatchLinear, dynamic_graph, input_shape
from retrieval.backends.ort_providers import ASCEND_DEFAULT_HOME as ASCEND_DEFAULT_HOME
from retrieval.backends.ort_providers import HOST, PROVIDERS, OrtProvider, accelerators, provider_named, setting_choices
from retrieval.backends.ort_providers import detect_ascend as detect_ascend
from retrieval.backends.ort_providers import detect_cuda as detect_cuda
from retrieval.errors import EncoderUnavailable, ModelError

if TYPE_CHECKING:
    from retrieval.shared_weights import SharedWeights

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
            # The cores go to another stream or a decode worker when a run ends (retrieval/machine_limits.py):
            # the pool spins between the parallel sections of a run — the cores are its own then, and
            # waking threads per operator cost text at batch 1 a fifth of its time (9.0 -> 7.3 ms,
            # ViT-B-16 int8 on a 2-core AVX-512 EPYC, benchmarks/bench_one_session.py) — but stops when
            # the run ends.
            options.add_session_config_entry("session.force_spinning_stop", "1")
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
    """A `ModelSession` over one bucket graph.

    With `config.dynamic_shapes` (the CPU) it runs on its stream's one shape-dynamic session, which
    holds the only prepacked copy of the tower's weights (`StreamGraphs`); with `config.weights` it
    reads the tower's shared weights; if they cannot be handed over, or ONNX Runtime refuses the
    session with them, it says so once and loads its own copy."""

    def __init__(self, path: Path, config: SessionConfig, input_name: str, output_name: str) -> None:
        self.input_name = input_name
        self.output_name = output_name
        # ONNX Runtime computes in the graph's own types: an int8 graph's matmuls are int8, the rest fp32.
        self.engine_precision = config.precision
        self._path = path
        self._graphs: StreamGraphs | None = None
        if config.dynamic_shapes and _provider(config.provider).on_host:
            self._graphs = StreamGraphs.of(config, path, input_name)
            self._graphs.add(path)
            self.providers = [HOST.ort_name]
            return
        self.weights, self._session = open_bucket_session(path, config)
        self.providers = self._session.get_providers()

    def any_batch_up_to(self) -> int:
        """The most rows this graph's session runs at any batch size from 1, unpadded (one
        shape-dynamic session); 0 where it runs its own bucket's size only."""
        return self._graphs.any_batch_up_to(self._path) if self._graphs is not None else 0

    def any_length_up_to(self) -> int:
        """The longest text this graph's session runs at any length (its batch's longest row, not a
        length bucket); 0 where it runs its own bucket's length only."""
        return self._graphs.any_length_up_to(self._path) if self._graphs is not None else 0

    def run(self, batch: np.ndarray) -> np.ndarray:
        session = self._graphs.session_for(self._path) if self._graphs is not None else self._session
        return session.run([self.output_name], {self.input_name: batch})[0]


def open_bucket_session(path: Path, config: SessionConfig) -> tuple[SharedWeights | None, Any]:
    """One graph's `InferenceSession`, on the shared weights where `config` has them (the weights it
    reads, which must live as long as it does), else loading its own copy."""
    weights = config.weights if config.weights is not None and config.weights.usable else None
    if weights is not None:
        try:
            session = _open(path, config)
            weights.record_session()
            return weights, session
        except (OSError, ValueError, ModelError) as exc:
            weights.give_up(f"{path.name}: {exc}")
            session_log.warning("%s: cannot share weights, each session loads its own copy: %s", weights.label, exc)
    return None, _open(path, config.unshared())


def _open(path: Path | bytes, config: SessionConfig, folder: Path | None = None) -> Any:
    """An `InferenceSession` of the graph at `path` (or serialized, its external data in `folder`)."""
    import onnxruntime as ort

    errors: tuple[type[BaseException], ...] = (RuntimeError, *ort_errors())
    what = path if isinstance(path, Path) else f"in {folder}"
    try:
        options = ort_session_options(config)
        if config.weights is not None and isinstance(path, Path):
            config.weights.add_to(options, path)
        if folder is not None:
            options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
        model = str(path) if isinstance(path, Path) else path
        return ort.InferenceSession(model, sess_options=options, providers=ort_providers(config))
    except errors as exc:
        raise ModelError(f"cannot open graph {what}: {exc}") from exc


class StreamGraphs:
    """The graphs one stream opened for one tower on the CPU, and the sessions that serve them.

    Registered at open, opened at the first run (by then the stream has registered every shape):
    every shape one rewritten graph can take (retrieval/backends/ort_batch.py) runs on one session
    that loads and prepacks its own copy of the weights — all batches and text lengths, else one per
    text length; a graph that cannot, or one registered after that first run, gets its own session on
    the shared weights, as before."""

    def __init__(self, config: SessionConfig) -> None:
        # A copy without the registry that holds this object: no reference cycle, so the compiled
        # models go with the stream's last session, not at some later garbage collection (the
        # quality gate grew 735 MB per OpenVINO shape opened: 19.4 GB converting ViT-B-16).
        self.config = dataclasses.replace(config)
        self.paths: list[Path] = []
        self.sessions: dict[Path, Any] = {}
        self.bounds: dict[Path, list[tuple[int, int]]] = {}  # a shape-dynamic session's (least, most) per axis
        self._lock = threading.Lock()  # streams are single-threaded; this only guards a misuse

    @classmethod
    def of(cls, config: SessionConfig, path: Path, input_name: str) -> StreamGraphs:
        return config.stream_models.setdefault(("onnxruntime", path.parent, input_name), cls(config))  # type: ignore[no-any-return]

    def add(self, path: Path) -> None:
        if not path.is_file():
            raise ModelError(f"cannot open graph {path}: no such file")
        with self._lock:
            self.paths.append(path)

    def session_for(self, path: Path) -> Any:
        with self._lock:
            if path not in self.sessions:
                self._open([p for p in dict.fromkeys(self.paths) if p not in self.sessions])
            return self.sessions[path]

    def any_batch_up_to(self, path: Path) -> int:
        self.session_for(path)
        return any_batch_up_to(self.bounds.get(path, []))

    def any_length_up_to(self, path: Path) -> int:
        self.session_for(path)
        return any_length_up_to(self.bounds.get(path, []))

    def _open(self, pending: list[Path]) -> None:
        try:
            shapes = {p: input_shape(p) for p in pending}
        except (NotBatchLinear, OSError, DecodeError) as exc:
            log.info("onnxruntime: %s: one session per graph (%s)", pending[0].parent, exc)
            shapes = {}
        for path in [p for p in pending if p not in shapes]:
            self.sessions[path] = open_bucket_session(path, self.config)[1]
        pending = [p for p in pending if p in shapes]
        by_rest: dict[tuple[int, ...], list[Path]] = {}
        for p in pending:
            by_rest.setdefault(shapes[p][1:], []).append(p)
        left = pending
        for groups in [[pending], list(by_rest.values())] if len(by_rest) > 1 else [[pending]]:
            left = []
            for part in groups:
                distinct = len({shapes[p] for p in part}) == len(part)
                if len(part) < 2 or not distinct or not self._open_dynamic({shapes[p]: p for p in part}):
                    left += part
            if len(left) < len(pending):
                break
        for path in left:
            self.sessions[path] = open_bucket_session(path, self.config)[1]

    def _open_dynamic(self, paths: dict[tuple[int, ...], Path]) -> bool:
        names = ", ".join(p.name for p in paths.values())
        try:
            graph = dynamic_graph(paths)
            session = _open(graph.model.SerializeToString(), self.config.unshared(), graph.folder)
        except (NotBatchLinear, ModelError, OSError, ValueError, DecodeError) as exc:
            log.info("onnxruntime: %s cannot share one session (%s)", names, exc)
            return False
        log.debug("onnxruntime: %s run on one session (%d shape constants rebuilt)", names, graph.rebuilt)
        self.sessions.update(dict.fromkeys(paths.values(), session))
        self.bounds.update(dict.fromkeys(paths.values(), graph.bounds))
        return True


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
    dynamic_sessions=lambda provider: _provider(provider).on_host,
    uses_cpu_cores=lambda provider: _provider(provider).on_host,
    open_session=OrtSession,
    version=_version,
    errors=ort_errors,
    variants=("fp32", "fp16", "int8"),
    devices=tuple(PROVIDERS),
    host_device=HOST.name,
    triton_kind=lambda provider: _provider(provider).triton_kind,
)
