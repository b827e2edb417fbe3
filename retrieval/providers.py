"""ONNX Runtime's providers and the session configuration: moved to `retrieval/backends/`.

The execution backends are records in one registry now (`retrieval/backends/__init__.py`); ONNX
Runtime's providers are records in `retrieval/backends/ort_providers.py` (names, options, detection)
and `retrieval/backends/onnxruntime.py` chooses among them. This module
only re-exports the names its earlier callers import (benchmarks, tests), so nothing branches here.
"""

from __future__ import annotations

from retrieval.backends.base import Detection, SessionConfig, cpu_thread_plan
from retrieval.backends.onnxruntime import (
    ASCEND_DEFAULT_HOME,
    ORT_PROVIDER,
    ProviderChoice,
    choose_precision,
    choose_provider,
    detect_ascend,
    detect_cuda,
    weight_sharing,
)

__all__ = [
    "ASCEND_DEFAULT_HOME",
    "ORT_PROVIDER",
    "Detection",
    "ProviderChoice",
    "SessionConfig",
    "choose_precision",
    "choose_provider",
    "cpu_thread_plan",
    "detect_ascend",
    "detect_cuda",
    "weight_sharing",
]
