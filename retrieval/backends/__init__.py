"""The registry of execution backends: one record per engine (see `base.Backend`).

Adding a backend is one module that builds a `Backend` record plus one line in `BACKENDS`; the
encoder, `cnclip tune`, the quality gate and the benchmarks all read this tuple. Importing this
package imports no engine: each record imports its engine when asked.
"""

from __future__ import annotations

from retrieval.backends.base import Backend, Detection, DeviceChoice, SessionConfig, cpu_thread_plan
from retrieval.backends.onnxruntime import ONNXRUNTIME
from retrieval.backends.openvino import OPENVINO
from retrieval.errors import ModelError

# The first is the default: what runs without a tuning file (`CNCLIP_BACKEND=auto`).
BACKENDS: tuple[Backend, ...] = (ONNXRUNTIME, OPENVINO)
DEFAULT_BACKEND = BACKENDS[0]

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "Backend",
    "Detection",
    "DeviceChoice",
    "SessionConfig",
    "backend_named",
    "cpu_thread_plan",
    "engine_errors",
    "engine_versions",
]


def backend_named(name: str) -> Backend:
    """The record called `name`; a name no record has is a `ModelError` that lists the known ones."""
    for backend in BACKENDS:
        if backend.name == name:
            return backend
    raise ModelError(f"unknown backend {name!r}; known: {', '.join(b.name for b in BACKENDS)}")


def engine_versions() -> dict[str, str | None]:
    """Each backend's engine version (None where it is not installed): part of the tuning fingerprint."""
    return {backend.name: backend.version() for backend in BACKENDS}


def engine_errors() -> tuple[type[BaseException], ...]:
    """Every backend's own exception types, for code that runs any session (warm-up, the gate)."""
    errors: list[type[BaseException]] = [RuntimeError, ValueError, ModelError]
    for backend in BACKENDS:
        errors += [e for e in backend.errors() if e not in errors]
    return tuple(errors)
