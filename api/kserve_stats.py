"""Triton's per-model statistics for `/v2` (`GET /v2/models/{name}/stats`), counted per request."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from api.kserve_tensors import MODEL_VERSION, MODELS

_STAGES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
_BATCH_STAGES = ("compute_input", "compute_infer", "compute_output")


def _duration() -> dict[str, int]:
    return {"count": 0, "ns": 0}


@dataclass
class ModelStats:
    """Triton's per-model statistics, counted per request.

    The encoder's batcher is shared with /v1 and merges requests of both, so `execution_count`
    counts requests (not batches) and `batch_stats` is keyed by the request's batch size. The
    batcher's queue wait is inside `compute_infer` (it is not timed per request), so `queue` is 0.
    """

    last_inference: int = 0  # ms since the epoch
    inference_count: int = 0  # items
    execution_count: int = 0
    stages: dict[str, dict[str, int]] = field(default_factory=lambda: {k: _duration() for k in _STAGES})
    batches: dict[int, dict[str, dict[str, int]]] = field(default_factory=dict)

    def add(self, stage: str, ns: int, stages: dict[str, dict[str, int]] | None = None) -> None:
        entry = (self.stages if stages is None else stages)[stage]
        entry["count"] += 1
        entry["ns"] += ns

    def success(self, items: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        self.last_inference = time.time_ns() // 1_000_000
        self.inference_count += items
        self.execution_count += 1
        self.add("success", input_ns + infer_ns + output_ns)
        self.add("queue", 0)
        batch = self.batches.setdefault(items, {k: _duration() for k in _BATCH_STAGES})
        for stage, ns in zip(_BATCH_STAGES, (input_ns, infer_ns, output_ns), strict=True):
            self.add(stage, ns)
            self.add(stage, ns, batch)

    def to_json(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "version": MODEL_VERSION,
            "last_inference": self.last_inference,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": self.stages,
            "response_stats": {},
            "batch_stats": [{"batch_size": size, **stages} for size, stages in sorted(self.batches.items())],
            "memory_usage": [],
        }


def model_stats_of(request: Request) -> dict[str, ModelStats]:
    """This app's statistics (kept on app.state, so two apps in one process never share them)."""
    state = request.app.state
    stats = getattr(state, "v2_stats", None)
    if stats is None:
        stats = state.v2_stats = {name: ModelStats() for name in MODELS}
    return stats
