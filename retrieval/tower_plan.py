"""What runs each tower: backend, device, run precision, prepacked shapes, streams — decided once at start.

Sources, in order: a tuning file made for this model on this machine (`cnclip tune`, see
retrieval/tuning.py) when `CNCLIP_BACKEND` is `auto` or names the backend it chose; else the
backend's defaults (`auto` means ONNX Runtime, exactly what ran before backends were a registry:
int8 on CPU where the model has it, fp16 on NPU/GPU, one shared weight copy per tower). An explicit
`CNCLIP_PRECISION` wins over the tuning file. A run precision that the manifest's quality-gate record
says failed for a tower (`extra.gate`, written by `cnclip convert`) is never picked by `auto` and is
refused when asked for. `CNCLIP_MEMORY_BUDGET_MB` bounds the weight copies
(retrieval/memory_budget.py): tuned prepacked shapes are dropped, least useful first, until the plan
fits.

Everything backend-specific is asked of the backend's record (retrieval/backends/).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import onnx

from retrieval.backends import DEFAULT_BACKEND, Backend, DeviceChoice, backend_named
from retrieval.config import RuntimeSettings
from retrieval.errors import EncoderUnavailable, ModelError
from retrieval.manifest import ModelManifest
from retrieval.memory_budget import BudgetSetting, resolve_budget
from retrieval.recorded_gate import recorded_failures
from retrieval.tuning import Shape, TowerChoice, TuningFile, parse_shape_key, shape_key
from retrieval.types import TOWERS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TowerPlan:
    tower: str
    backend: Backend
    device: DeviceChoice
    precision: str  # run precision
    graph: str  # the graph variant opened
    buckets: list[int]
    share: bool  # the tower's sessions read one shared weight copy (where not prepacked)
    prepack: frozenset[Shape] = frozenset()
    streams: int = 1
    threads_per_stream: int = 0
    source: str = "defaults"
    prepack_gain: dict[Shape, float] = field(default_factory=dict, compare=False)
    dynamic: bool = False  # one shape-dynamic session per stream (CNCLIP_DYNAMIC_SHAPES, ONNX Runtime's CPU)

    @property
    def one_copy(self) -> bool:
        """A stream's shapes of this tower hold one copy of the weights together (one model for every shape)."""
        return self.dynamic or self.backend.shapes_share_a_copy(self.device.name)

    def placement(self) -> str:
        """ "cpu" for the default backend (the words start-up lines always had), else "openvino CPU"."""
        device = self.device.name
        return device if self.backend is DEFAULT_BACKEND else f"{self.backend.name} {device}"

    def weights_words(self) -> str:
        """How the tower's sessions hold their weights, in the words of the start-up log."""
        packed = ",".join(shape_key(s) for s in sorted(self.prepack, key=lambda s: (s[1] or 0, s[0])))
        if self.dynamic:
            own = f"; beside it, its own prepacked copy for {packed} (tuned)" if packed else ""
            return "one prepacked copy per stream: one shape-dynamic session for every bucket and text length" + own
        if self.share:
            own = f"; its own prepacked copy for {packed} (tuned)" if packed else ""
            return (
                "one copy per tower and precision, mapped from its data file (prepacking and per-session arenas off)"
                + own
            )
        if self.backend.shapes_share_a_copy(self.device.name):
            return f"one compiled copy per stream that every bucket shares ({self.backend.name} {self.device.name})"
        if not self.backend.shares_weights(self.device.name):
            return f"not shared on {self.backend.name} {self.device.name}: each session keeps its own copy"
        return "not shared (CNCLIP_SHARE_WEIGHTS=false): each bucket session has its own prepacked copy"


def _choose_device(backend: Backend, requested: str, cache_: dict[str, DeviceChoice]) -> DeviceChoice:
    key = f"{backend.name}:{requested}"
    if key not in cache_:
        found = backend.detect()
        if not found.found:
            raise EncoderUnavailable(f"backend {backend.name} is not usable here: {found.reason}")
        cache_[key] = backend.choose_device(requested)
    return cache_[key]


def _from_tuning(
    tower: str,
    choice: TowerChoice,
    manifest: ModelManifest,
    settings: RuntimeSettings,
    devices: dict[str, DeviceChoice],
) -> TowerPlan:
    """The tuned choice for a tower; ModelError/EncoderUnavailable when it no longer fits this process."""
    backend = backend_named(choice.backend)
    chosen = _choose_device(backend, choice.device, devices)
    device = DeviceChoice(chosen.name, f"the tuning file's choice, {chosen.reason}")
    offered = backend.precisions(device.name, manifest.towers[tower].precisions())
    if choice.precision not in offered:
        raise ModelError(f"{backend.name} on {device.name} does not offer {choice.precision} for {tower} here")
    if (backend.name, choice.precision, tower) in recorded_failures(manifest.extra):
        raise ModelError(f"the manifest's quality gate refused {tower} on {backend.name} {choice.precision}")
    graph = offered[choice.precision]
    explicit = settings.model_fields_set
    return TowerPlan(
        tower=tower,
        backend=backend,
        device=device,
        precision=choice.precision,
        graph=graph,
        buckets=_buckets(manifest, tower, graph, settings),
        share=settings.share_weights and backend.shares_weights(device.name),
        # As the tuner measured it: one shape-dynamic session, or a session per shape (some prepacked).
        dynamic=settings.dynamic_shapes and backend.dynamic_sessions(device.name) and choice.one_session(),
        prepack=frozenset(choice.prepacked()),
        streams=settings.streams if "streams" in explicit else choice.streams,
        threads_per_stream=settings.threads_per_stream
        if "threads_per_stream" in explicit
        else choice.threads_per_stream,
        source="tuning file",
        prepack_gain={parse_shape_key(k): v.prepack_gain or 1.0 for k, v in choice.shapes.items() if v.prepack},
    )


def _buckets(manifest: ModelManifest, tower: str, graph: str, settings: RuntimeSettings) -> list[int]:
    have = manifest.towers[tower].buckets(graph)
    buckets = [b for b in settings.buckets if b in have]
    if not buckets:
        raise ModelError(
            f"none of the configured buckets {settings.buckets} exist for {tower}/{graph} (the model directory has {have})"
        )
    return buckets


def _from_defaults(
    tower: str, backend: Backend, manifest: ModelManifest, settings: RuntimeSettings, devices: dict[str, DeviceChoice]
) -> TowerPlan:
    device = _choose_device(backend, getattr(settings, backend.device_setting), devices)
    available = manifest.towers[tower].precisions()
    offered = backend.precisions(device.name, available)
    failed = recorded_failures(manifest.extra)
    requested: str = settings.precision
    if requested != "auto":
        if requested not in offered:
            if requested in backend.variants and requested not in available:
                # The message this setting always gave with ONNX Runtime.
                raise ModelError(
                    f"CNCLIP_PRECISION={requested} but the model directory only has {', '.join(available)} graphs"
                )
            raise ModelError(
                f"CNCLIP_PRECISION={requested}: {backend.name} on {device.name} offers "
                f"{', '.join(offered) or 'nothing'} for the {tower} tower of this model"
            )
        if (backend.name, requested, tower) in failed:
            raise ModelError(
                f"CNCLIP_PRECISION={requested}: the quality gate refused {tower} on {backend.name} "
                f"({failed[backend.name, requested, tower]})"
            )
        precision = requested
    else:
        allowed = [p for p in offered if (backend.name, p, tower) not in failed]
        if not allowed:
            raise ModelError(f"{backend.name} on {device.name} has no usable precision for the {tower} tower")
        precision = allowed[0]
    graph = offered[precision]
    return TowerPlan(
        tower=tower,
        backend=backend,
        device=device,
        precision=precision,
        graph=graph,
        buckets=_buckets(manifest, tower, graph, settings),
        share=settings.share_weights and backend.shares_weights(device.name),
        dynamic=settings.dynamic_shapes and backend.dynamic_sessions(device.name),
        streams=settings.streams,
        threads_per_stream=settings.threads_per_stream,
        source="settings" if settings.backend != "auto" else "defaults",
    )


def plan_towers(
    settings: RuntimeSettings,
    manifest: ModelManifest,
    tuning: TuningFile | None,
    devices: dict[str, DeviceChoice] | None = None,
) -> dict[str, TowerPlan]:
    """One plan per tower (see the module docstring)."""
    devices = {} if devices is None else devices
    plans: dict[str, TowerPlan] = {}
    for tower in TOWERS:
        choice = tuning.towers.get(tower) if tuning is not None else None  # type: ignore[call-overload]
        if choice is not None and settings.backend not in ("auto", choice.backend):
            choice = None
        if choice is not None and settings.precision not in ("auto", choice.precision):
            choice = None
        if choice is not None:
            try:
                plans[tower] = _from_tuning(tower, choice, manifest, settings, devices)
                continue
            except (ModelError, EncoderUnavailable) as exc:
                log.warning("tuning file: %s's choice cannot be used (%s); the defaults run it", tower, exc.message)
        backend = DEFAULT_BACKEND if settings.backend == "auto" else backend_named(settings.backend)
        plans[tower] = _from_defaults(tower, backend, manifest, settings, devices)
    return plans


# --- memory --------------------------------------------------------------------------------------
@cache
def _graph_weight_bytes(path: Path) -> int:
    model = onnx.load(str(path), load_external_data=False)
    total = 0
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in tensor.external_data}
            total += int(info.get("length", 0))
        else:
            total += len(tensor.raw_data)
    return total


def weight_bytes(manifest: ModelManifest, tower: str, graph: str, precision: str = "") -> int:
    """One copy of a tower's weights in a graph variant (its smallest bucket graph's initializers);
    a float graph run in bf16/fp16 (OpenVINO's precision hint) keeps its weights at 2 bytes."""
    bucket = min(manifest.towers[tower].buckets(graph))
    size = _graph_weight_bytes(manifest.graph_path(tower, graph, bucket))
    return size // 2 if graph == "fp32" and precision in ("bf16", "fp16") else size


def plan_bytes(plan: TowerPlan, shapes: int, copy_bytes: int) -> int:
    """Weight bytes a tower's plan holds: the shared copy once, each session with its own copy once
    (where the backend's shapes hold one copy together: once per stream, and once more per stream for
    each prepacked shape beside a shape-dynamic session)."""
    if plan.one_copy:
        beside = len(plan.prepack) if plan.dynamic else 0
        return plan.streams * (1 + beside) * copy_bytes
    own = len(plan.prepack) if plan.share else shapes
    return (copy_bytes if plan.share else 0) + plan.streams * own * copy_bytes


def fit_budget(
    plans: dict[str, TowerPlan],
    manifest: ModelManifest,
    setting: BudgetSetting,
    shapes_of: Callable[[TowerPlan], int],
    tuning: TuningFile | None = None,
) -> dict[str, TowerPlan]:
    """Drop prepacked shapes (the smallest measured gain first) until the weight copies fit the
    budget (retrieval/memory_budget.py); a plan that cannot fit even then is a `ModelError` naming
    what it needs under an explicit budget, one log line under `auto`."""
    copies = {t: weight_bytes(manifest, t, p.graph, p.precision) for t, p in plans.items()}
    tuned = tuning.memory_budget_mb if tuning is not None and _tuned(plans) else None
    budget = resolve_budget(setting, sum(copies.values()) / 2**20, tuned)

    def total() -> int:
        return sum(plan_bytes(p, shapes_of(p), copies[t]) for t, p in plans.items())

    plans = dict(plans)
    candidates = sorted(
        ((p.prepack_gain.get(s, 1.0), t, s) for t, p in plans.items() if _own_copies(p) for s in p.prepack),
        key=lambda c: c[0],
    )
    for _gain, tower, shape in candidates:
        if budget.allows(total() / 2**20):
            break
        plans[tower] = dataclasses.replace(plans[tower], prepack=plans[tower].prepack - {shape})
        instead = "runs on the one shape-dynamic session" if plans[tower].dynamic else "shares the weights"
        log.info("memory budget (%s): %s %s %s instead of its own prepacked copy",
                 budget.source, tower, shape_key(shape), instead)  # fmt: skip
    needed = total() / 2**20
    if budget.allows(needed):
        return plans
    what = ", ".join(f"{t}: {p.placement()} {p.precision}, {p.weights_words()}" for t, p in plans.items())
    if budget.strict:
        raise ModelError(
            f"CNCLIP_MEMORY_BUDGET_MB={budget.mb} but the towers' weights need {needed:.0f} MB here ({what}); "
            "raise the budget, or run a backend that shares weights (onnxruntime on the CPU)"
        )
    log.info("the towers' weights need %.0f MB, over the memory budget (%s): %s", needed, budget.source, what)
    return plans


def _own_copies(plan: TowerPlan) -> bool:
    """Whether the plan's prepacked shapes are copies a budget can drop (back to the shared copy, or
    to the stream's one shape-dynamic session)."""
    return plan.dynamic or (plan.share and not plan.one_copy)


def _tuned(plans: dict[str, TowerPlan]) -> bool:
    return any(p.source == "tuning file" for p in plans.values())
