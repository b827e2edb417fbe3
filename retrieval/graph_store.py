"""Write a tower's bucket graphs so that their weights are stored once.

Each bucket is its own fixed-shape ONNX graph, but the weights of all buckets are the same
bytes. Every initializer larger than `min_bytes` goes into one shared external-data file,
deduplicated by content, and each graph points at it by offset. ONNX Runtime resolves the
data file relative to the graph's own path.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import onnx
from onnx import numpy_helper

ALIGNMENT = 64  # keeps every tensor's offset friendly to memory-mapping


class SharedWeightsFile:
    """One external-data file that graphs are saved against one at a time; equal tensors are stored once.

    Use as a context manager; graphs may be added across several calls (a tower's length buckets
    are exported one length at a time, so that only one length's protos are in memory).
    """

    def __init__(self, directory: Path, data_name: str, min_bytes: int = 1024) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.data_name = data_name
        self.min_bytes = min_bytes
        self.written: list[str] = []
        self._stored: dict[bytes, tuple[int, int]] = {}
        self._data = (self.directory / data_name).open("wb")

    def add(self, file_name: str, model: onnx.ModelProto) -> None:
        """Move `model`'s large initializers into the data file (in place) and write `file_name`."""
        data = self._data
        for tensor in model.graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                raise ValueError(f"{file_name}: initializer {tensor.name} is already external; load it first")
            if not tensor.HasField("raw_data"):
                tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
            raw = tensor.raw_data
            if len(raw) < self.min_bytes:
                continue
            key = hashlib.sha256(raw).digest()
            if key not in self._stored:
                data.write(b"\0" * (-data.tell() % ALIGNMENT))
                self._stored[key] = (data.tell(), len(raw))
                data.write(raw)
            offset, length = self._stored[key]
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            for k, v in (("location", self.data_name), ("offset", str(offset)), ("length", str(length))):
                entry = tensor.external_data.add()
                entry.key, entry.value = k, v
        # Serialise directly: onnx.save_model would try to re-home external tensors.
        (self.directory / file_name).write_bytes(model.SerializeToString())
        self.written.append(file_name)

    def close(self) -> None:
        if self._data.closed:
            return
        self._data.flush()
        os.fsync(self._data.fileno())
        self._data.close()

    def __enter__(self) -> SharedWeightsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def save_sharing_weights(
    graphs: dict[str, onnx.ModelProto], directory: Path, data_name: str, min_bytes: int = 1024
) -> list[str]:
    """Save `graphs` (file name -> model) into `directory`; returns the written file names."""
    with SharedWeightsFile(directory, data_name, min_bytes) as shared:
        for file_name, model in graphs.items():
            shared.add(file_name, model)
    return [*shared.written, data_name]
