"""The tuning file `cnclip tune` writes beside the manifest, and how the runtime reads it.

`tuning.json` records, for one model on one machine, which backend, device and run precision each
tower uses, which of its shapes get their own prepacked session, and how many streams — with the
measurements and gate results the choice came from, and the machine's fingerprint (CPU model, the
SIMD flags that pick kernels, cores this process may use, engine versions). The runtime uses it
only when it was made for this model (its `model_id`) on a machine with the same fingerprint;
otherwise — or when the file is marked untrusted (`trusted: false`: measured while other work
competed for the CPUs) — it logs one line suggesting `cnclip tune` and runs the safe defaults (today's: ONNX
Runtime, int8 on CPU where the model has it, one shared weight copy per tower).

The file is read as hostile input: a regular file (a FIFO or a device is refused unopened or
unblocked, retrieval/regular_file.py) of at most `MAX_BYTES`, parsed against a strict schema (unknown
fields, repeated keys, unknown backends or precisions, odd shape keys, out-of-range numbers, and more
streams or threads than the cores this process may run on, retrieval/machine_limits.py, are refused),
and refused with one line naming the problem — never a crash, never half used.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from retrieval.backends.base import RUN_PRECISIONS
from retrieval.errors import InvalidInput
from retrieval.json_text import loads
from retrieval.machine_limits import inference_threads_refusal
from retrieval.regular_file import UnusableFile, read_regular

log = logging.getLogger(__name__)

TUNING_NAME = "tuning.json"
FORMAT_VERSION = 1
MAX_BYTES = 4 << 20
# The CPU features that decide which kernels the engines pick (x86 and Arm).
KERNEL_FLAGS = (
    "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "sve",
)  # fmt: skip
SHAPE_KEY = re.compile(r"^b([1-9]\d{0,4})(?:\.l([1-9]\d{0,3}))?$")

Shape = tuple[int, int | None]


def shape_key(shape: Shape) -> str:
    """(8, None) -> "b8"; (1, 16) -> "b1.l16"."""
    bucket, length = shape
    return f"b{bucket}" + (f".l{length}" if length else "")


def parse_shape_key(key: str) -> Shape:
    match = SHAPE_KEY.match(key)
    if match is None:
        raise ValueError(f"shape {key!r} is not bN or bN.lM")
    return int(match[1]), int(match[2]) if match[2] else None


# --- the machine -------------------------------------------------------------------------------
def machine_fingerprint(cpuinfo: str | None = None, cores: int | None = None) -> dict[str, Any]:
    """CPU model, kernel-deciding flags, usable cores and engine versions of this machine."""
    from retrieval.backends import engine_versions

    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {
        "cpu": fields.get("model name") or fields.get("CPU part") or "unknown",
        "flags": [f for f in KERNEL_FLAGS if f in flags],
        "cores": cores or len(os.sched_getaffinity(0)),
        "engines": {name: version for name, version in engine_versions().items() if version},
    }


def fingerprint_difference(recorded: Fingerprint, current: dict[str, Any]) -> str | None:
    """Why a recorded fingerprint is not this machine's (None when it is)."""
    differences = []
    if recorded.cpu != current["cpu"]:
        differences.append(f"CPU {recorded.cpu!r} there, {current['cpu']!r} here")
    if sorted(recorded.flags) != sorted(current["flags"]):
        differences.append(f"CPU flags {' '.join(recorded.flags)} there, {' '.join(current['flags'])} here")
    if recorded.cores != current["cores"]:
        differences.append(f"{recorded.cores} cores there, {current['cores']} here")
    for engine, version in sorted(recorded.engines.items()):
        if current["engines"].get(engine) != version:
            differences.append(f"{engine} {version} there, {current['engines'].get(engine) or 'absent'} here")
    return "; ".join(differences) or None


# --- the file's schema -------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Fingerprint(_Strict):
    cpu: str = Field(max_length=200)
    flags: list[str] = Field(max_length=len(KERNEL_FLAGS))
    cores: int = Field(ge=1, le=4096)
    engines: dict[str, str] = Field(max_length=16)


class ShapeChoice(_Strict):
    prepack: bool
    ms: float | None = Field(None, ge=0, le=3.6e6)  # the chosen configuration's fastest pass (its median call)
    prepack_gain: float | None = Field(None, ge=0, le=1000)  # shared ms / prepacked ms


class TowerChoice(_Strict):
    backend: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    device: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9._-]{0,31}$")
    precision: Literal["fp32", "fp16", "bf16", "int8"]
    streams: int = Field(1, ge=1, le=64)
    threads_per_stream: int = Field(0, ge=0, le=4096)
    shapes: dict[str, ShapeChoice] = Field(default_factory=dict, max_length=1024)
    # One shape-dynamic session per stream for every shape, with its own prepacked copy (where the
    # backend can: ONNX Runtime's CPU); shapes marked prepack run beside it on their own prepacked
    # session. None — a file from before the tuner measured it — means what `serve` did with such
    # files: the one session when no shape is prepacked.
    dynamic: bool | None = None

    def prepacked(self) -> set[Shape]:
        return {parse_shape_key(k) for k, v in self.shapes.items() if v.prepack}

    def one_session(self) -> bool:
        """Whether the choice runs a stream's shapes on one shape-dynamic session (where the backend can)."""
        return self.dynamic if self.dynamic is not None else not self.prepacked()

    def words(self) -> str:
        """`onnxruntime cpu int8, prepacked b1,b1.l16, 1 stream(s)`."""
        packed = ",".join(shape_key(s) for s in sorted(self.prepacked(), key=lambda s: (s[1] or 0, s[0])))
        extra = f", prepacked {packed}" if packed else ""
        if self.dynamic:
            extra = ", one shape-dynamic session" + (f" and prepacked {packed}" if packed else "")
        return f"{self.backend} {self.device} {self.precision}{extra}, {self.streams} stream(s)"


class Measurement(_Strict):
    tower: Literal["image", "text"]
    shape: str = Field(pattern=SHAPE_KEY.pattern)
    backend: str = Field(max_length=32)
    device: str = Field(max_length=32)
    precision: Literal["fp32", "fp16", "bf16", "int8"]
    weights: Literal["shared", "prepacked", "own", "dynamic"]
    ms: float = Field(ge=0)
    ms_min: float = Field(ge=0)
    ms_max: float = Field(ge=0)


class ValidationPoint(_Strict):
    """One tower at one concurrency, the choice against the defaults, each served by a `cnclip worker`
    over HTTP: items/s, the medians of interleaved passes."""

    tower: Literal["image", "text"]
    concurrency: int = Field(ge=1, le=1024)
    tuned_items_s: float = Field(ge=0)
    default_items_s: float = Field(ge=0)


class TuneReport(_Strict):
    """How the tuning run went: its memory peak and duration, the load beside it, the validation."""

    seconds: float = Field(ge=0)
    peak_rss_mb: float = Field(ge=0)  # the whole run's peak resident memory (the quality gate included)
    measure_peak_rss_mb: float = Field(0, ge=0)  # the peak while measuring: ≤ base + largest configuration
    validate_peak_rss_mb: float = Field(0, ge=0)  # while validating: this process's peak + one worker's
    base_rss_mb: float = Field(0, ge=0)  # resident between configurations (all closed), at its highest
    largest_candidate_mb: float = Field(0, ge=0)  # the most one configuration added while it opened and ran
    measurements: int = Field(1, ge=0, le=100)  # 2: measured again because other work competed
    other_cpu_cores: float = Field(0, ge=0)  # other processes' CPU on our cores while measuring (cores)
    load_average: float = Field(0, ge=0)  # the 1-minute load average at the start
    noisy_cases: int = Field(0, ge=0)  # cases whose spread stayed above the bound
    validation: list[ValidationPoint] = Field(default_factory=list, max_length=64)
    kept_defaults: list[Literal["image", "text"]] = Field(default_factory=list, max_length=2)
    rejected: dict[Literal["image", "text"], TowerChoice] = Field(default_factory=dict)  # what they replaced


class TuningFile(_Strict):
    format: Literal[1]
    model_id: str = Field(max_length=300)
    created: str = Field(max_length=40)
    fingerprint: Fingerprint
    objective: Literal["latency", "throughput"] = "latency"
    memory_budget_mb: int = Field(0, ge=0)
    towers: dict[Literal["image", "text"], TowerChoice]
    gate: list[dict[str, Any]] = Field(default_factory=list, max_length=1024)
    measurements: list[Measurement] = Field(default_factory=list, max_length=100_000)
    # Made while other work competed for the CPUs (and still so when measured again): `serve` ignores
    # it. A file without the field (written before it existed) is trusted.
    trusted: bool = True
    untrusted_reason: str | None = Field(None, max_length=500, pattern=r"^[^\r\n]*$")  # one log line
    report: TuneReport | None = None

    def summary(self) -> str:
        return "; ".join(f"{tower} → {self.towers[tower].words()}" for tower in ("image", "text"))


assert set(RUN_PRECISIONS) == {"fp32", "fp16", "bf16", "int8"}  # the Literal types above say the same


# --- reading and writing ------------------------------------------------------------------------
@dataclass(frozen=True)
class TuningOutcome:
    """What the runtime makes of the tuning file: the choice (None: safe defaults) and its log line."""

    tuning: TuningFile | None
    line: str
    path: Path
    # INFO when used or simply absent (the demo, a fresh install); WARNING when one is there but refused.
    level: int = logging.WARNING


def tuning_path(model_dir: Path, configured: Path | None) -> Path:
    return configured if configured is not None else Path(model_dir) / TUNING_NAME


def _suggest(model_dir: Path) -> str:
    return f"run `cnclip tune --model {model_dir}` on this machine to measure and choose per tower"


def read_tuning(path: Path, model_id: str, model_dir: Path, current: dict[str, Any] | None = None) -> TuningOutcome:
    """Read and check a tuning file for this model and machine; every refusal is one line."""
    defaults = "each tower runs the defaults of CNCLIP_BACKEND (auto: ONNX Runtime, int8 where the model has it, one shared weight copy)"
    try:
        raw = read_regular(path, MAX_BYTES)  # never a FIFO or a device: a hang or an endless read
    except UnusableFile as exc:
        if exc.missing:
            line = f"no tuning file at {path}: {defaults}; {_suggest(model_dir)}"
            return TuningOutcome(None, line, path, logging.INFO)
        why = exc.reason.removeprefix("is ")
        return TuningOutcome(None, f"tuning file {path} refused ({why}): {defaults}; {_suggest(model_dir)}", path)
    here = current or machine_fingerprint()
    try:
        tuning = TuningFile.model_validate(loads(raw.decode("utf-8"), unique_keys=True))
        if set(tuning.towers) != {"image", "text"}:
            raise ValueError("it must choose for both towers, image and text")
        for tower, choice in tuning.towers.items():
            choice.prepacked()  # shape keys are checked here
            refusal = inference_threads_refusal(choice.streams, choice.threads_per_stream, here["cores"])
            if refusal is not None:
                raise ValueError(f"towers.{tower}: {refusal}")
    except (ValueError, UnicodeDecodeError, ValidationError) as exc:
        reason = _first_error(exc)
        return TuningOutcome(None, f"tuning file {path} refused ({reason}): {defaults}; {_suggest(model_dir)}", path)
    if not tuning.trusted:
        why = f"it is marked untrusted ({tuning.untrusted_reason or 'measured while other work competed'})"
        return TuningOutcome(None, f"tuning file {path} not used: {why}; {defaults}; {_suggest(model_dir)}", path)
    if tuning.model_id != model_id:
        why = f"it was made for model {tuning.model_id}, this is {model_id}"
        return TuningOutcome(None, f"tuning file {path} not used: {why}; {defaults}; {_suggest(model_dir)}", path)
    difference = fingerprint_difference(tuning.fingerprint, here)
    if difference is not None:
        why = f"it was made on another machine ({difference})"
        return TuningOutcome(None, f"tuning file {path} not used: {why}; {defaults}; {_suggest(model_dir)}", path)
    line = f"using tuning file {path} (made {tuning.created} on this machine): {tuning.summary()}"
    return TuningOutcome(tuning, line, path, logging.INFO)


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        return f"{where}: {first['msg']}"[:300]
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__


def write_tuning(path: Path, tuning: TuningFile) -> Path:
    """Write atomically (temporary file, fsync, rename); a directory we may not write is a clear error."""
    text = json.dumps(tuning.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise InvalidInput(
            f"cannot write the tuning file {path}: {exc.strerror or exc}; pass --out FILE (a writable place) "
            "and set CNCLIP_TUNING_FILE=FILE for serve/worker/index"
        ) from exc
    return path


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
