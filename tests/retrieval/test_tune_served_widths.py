"""`cnclip tune` times a text case as `serve` runs it: on the one shape-dynamic session at the width
the encoder cuts a batch to (its longest row, retrieval/text_lengths.py), on a static session padded
to the bucket's length.

Before, every configuration ran full-width dummy rows (16 and 52 tokens), so the one session was
charged for padding it never runs: on an AVX2 EPYC the three 16-token text cases read it 11–14 %
slower than static prepacked sessions, while served (7–8-token queries) it was 1.4–1.8× Triton's
static graph at every concurrency (issue 34, BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from retrieval.backends.onnxruntime import ONNXRUNTIME
from retrieval.manifest import ModelManifest
from retrieval.text_lengths import MIN_TIGHT_WIDTH, served_width, split_by_length
from retrieval.toolchain.gate import Candidate
from retrieval.toolchain.toy_model import write_toy_model
from retrieval.toolchain.tune.measure import TuneOptions, measure


class RecordingSession:
    """An engine session that notes the width of every batch it runs."""

    def __init__(self, inner: Any, widths: list[int]) -> None:
        self._inner, self._widths = inner, widths

    def run(self, batch: np.ndarray) -> np.ndarray:
        self._widths.append(batch.shape[1])
        return self._inner.run(batch)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class RecordingBackend:
    """ONNX Runtime, its sessions' widths noted per configuration (shared, prepacked, dynamic)."""

    def __init__(self) -> None:
        self.widths: dict[str, list[int]] = {}

    def open_session(self, path: Path, config: Any, input_name: str, output_name: str) -> RecordingSession:
        mode = "dynamic" if config.dynamic_shapes else ("shared" if config.weights is not None else "prepacked")
        inner = ONNXRUNTIME.open_session(path, config, input_name, output_name)
        return RecordingSession(inner, self.widths.setdefault(mode, []))

    def __getattr__(self, name: str) -> Any:
        return getattr(ONNXRUNTIME, name)


def test_served_width_is_the_middle_of_the_widths_a_bucket_holds() -> None:
    assert served_width(16, [16, 52]) == 9  # 2 … 16 tokens
    assert served_width(52, [16, 52]) == 35  # 17 … 52
    assert served_width(32, [16, 32, 52]) == 25  # 17 … 32
    assert served_width(52, [52]) == (MIN_TIGHT_WIDTH + 52 + 1) // 2
    # What the encoder runs a batch of such rows at, on a session that runs any width.
    ids = np.zeros((2, 52), dtype=np.int64)
    ids[:, :9] = 5
    assert [group.shape[1] for _, group in split_by_length(ids, [16, 52], tight=True)] == [9]


@pytest.mark.parametrize("precision", ["int8"])
def test_tune_times_the_one_session_at_served_widths_and_static_sessions_padded(tmp_path: Path, precision: str) -> None:
    write_toy_model(tmp_path, buckets=(1, 4), text_lengths=(16,))
    manifest = ModelManifest.load(tmp_path)
    backend = RecordingBackend()
    candidate = Candidate(backend, "cpu", precision, precision)  # type: ignore[arg-type]
    options = TuneOptions(rounds=2, seconds=0.02, cores=[0])
    measured = measure(manifest, {"text": [candidate]}, options, lambda *_: None)

    assert {shape for _, shape, _ in measured.samples} == {(1, None), (4, None), (1, 16), (4, 16)}
    assert set(backend.widths) == {"shared", "prepacked", "dynamic"}
    assert set(backend.widths["shared"]) == set(backend.widths["prepacked"]) == {16, 52}
    assert set(backend.widths["dynamic"]) == {served_width(16, [16, 52]), served_width(52, [16, 52])} == {9, 35}
