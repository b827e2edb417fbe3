"""One copy of a tower's weights for all of its bucket sessions (CPU).

Bucket graphs of one tower and precision point into one external-data file (see graph_store.py),
but ONNX Runtime, left to itself, gives each session its own copy: the CPU kernels prepack every
MatMul/Conv weight into a private buffer, and each session keeps a private activation arena that
never shrinks. With ViT-B-16 int8 and 5 buckets per tower that was ~0.9 GB of prepacked copies and
~2 GB of arenas (benchmarks/notes/shared-weights.md); with text length buckets it multiplies.

`SharedWeights` maps the data file once and gives every session of the tower the same OrtValue for
each stored tensor (`SessionOptions.add_initializer`). Tensors are keyed by *where they are stored*
(file, offset, length, type, shape), not by name: bucket graphs reuse a name for batch-shaped
constants whose bytes differ (the class token broadcast to the batch). Sharing only holds if the
kernels read those buffers instead of prepacking their own copies, and the python API has no
shared prepacked-weights container, so the sessions also turn prepacking off (the price: ~10 %
slower int8/fp32 matmuls on AVX2, measured in the notes) and run without a per-session arena.

The OrtValues wrap the mapped pages: keep this object alive as long as any session built on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto

# Element types a stored weight can have (anything else is not shared: the session loads it itself).
NUMPY_TYPES: dict[int, type[np.generic]] = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
    TensorProto.DOUBLE: np.float64,
    TensorProto.INT8: np.int8,
    TensorProto.UINT8: np.uint8,
    TensorProto.INT32: np.int32,
    TensorProto.INT64: np.int64,
}

StoredAt = tuple[Path, int, int, int, tuple[int, ...]]  # file, offset, length, element type, shape


class SharedWeights:
    """The external initializers of one tower and precision, mapped once, handed to every session."""

    def __init__(self, label: str) -> None:
        self.label = label  # e.g. "image/int8", for log lines
        self.sessions = 0  # sessions opened on these weights
        self.failure: str | None = None  # why sharing was given up (then sessions load their own copy)
        self._files: dict[Path, np.memmap] = {}
        self._values: dict[StoredAt, Any] = {}  # -> onnxruntime.OrtValue over the mapped bytes

    @property
    def tensors(self) -> int:
        """Distinct stored tensors handed out so far."""
        return len(self._values)

    @property
    def nbytes(self) -> int:
        """Bytes of those tensors: what N sessions hold once instead of N times."""
        return sum(key[2] for key in self._values)

    @property
    def usable(self) -> bool:
        return self.failure is None

    def give_up(self, reason: str) -> None:
        """Stop sharing: the sessions opened from now on load their own copy."""
        self.failure = reason

    def summary(self) -> str:
        if self.failure is not None:
            return (
                f"{self.label}: weights not shared ({self.failure}); {self.sessions} session(s) opened before "
                "that share them, the others have their own copy"
            )
        return (
            f"{self.label}: {self.sessions} session(s) share one copy of the weights "
            f"({self.tensors} tensors, {self.nbytes / 2**20:.1f} MiB, mapped from {len(self._files)} file(s))"
        )

    def add_to(self, options: Any, graph_path: Path) -> int:
        """Point `options` (an ort.SessionOptions) at the shared copy of each of the graph's external
        initializers; returns how many. Raises OSError or ValueError when a tensor cannot be shared."""
        try:
            model = onnx.load(str(graph_path), load_external_data=False)
        except DecodeError as exc:
            raise ValueError(f"cannot read {graph_path.name}: {exc}") from exc
        added = 0
        for tensor in model.graph.initializer:
            if tensor.data_location != TensorProto.EXTERNAL:
                continue  # small tensors live inside the graph; not worth sharing
            options.add_initializer(tensor.name, self._value(graph_path.parent, tensor))
            added += 1
        return added

    def record_session(self) -> None:
        """Count a session that opened on these weights."""
        self.sessions += 1

    def _value(self, directory: Path, tensor: TensorProto) -> Any:
        import onnxruntime as ort

        info = {entry.key: entry.value for entry in tensor.external_data}
        if "location" not in info:
            raise ValueError(f"initializer {tensor.name} has no external data location")
        path = (directory / info["location"]).resolve()
        dtype = NUMPY_TYPES.get(tensor.data_type)
        if dtype is None:
            raise ValueError(f"initializer {tensor.name} has element type {tensor.data_type}, not shareable")
        shape = tuple(int(d) for d in tensor.dims)
        offset = int(info.get("offset", 0))
        length = int(info.get("length", int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize))
        key: StoredAt = (path, offset, length, tensor.data_type, shape)
        value = self._values.get(key)
        if value is None:
            mapped = self._files.get(path)
            if mapped is None:
                # Copy-on-write: reads share the page cache; a write (ORT does not write to its
                # initializers) would get a private page rather than a crash on a read-only one.
                mapped = self._files[path] = np.memmap(path, dtype=np.uint8, mode="c")
            if offset % np.dtype(dtype).itemsize or offset + length > len(mapped):
                raise ValueError(f"initializer {tensor.name} lies outside {path.name} or is misaligned")
            array = mapped[offset : offset + length].view(dtype).reshape(shape)
            value = self._values[key] = ort.OrtValue.ortvalue_from_numpy(array)
        return value
