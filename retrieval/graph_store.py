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


def save_sharing_weights(
    graphs: dict[str, onnx.ModelProto], directory: Path, data_name: str, min_bytes: int = 1024
) -> list[str]:
    """Save `graphs` (file name -> model) into `directory`; returns the written file names."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stored: dict[bytes, tuple[int, int]] = {}
    written: list[str] = []
    with (directory / data_name).open("wb") as data:
        for file_name, model in graphs.items():
            for tensor in model.graph.initializer:
                if tensor.data_location == onnx.TensorProto.EXTERNAL:
                    raise ValueError(f"{file_name}: initializer {tensor.name} is already external; load it first")
                if not tensor.HasField("raw_data"):
                    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
                raw = tensor.raw_data
                if len(raw) < min_bytes:
                    continue
                key = hashlib.sha256(raw).digest()
                if key not in stored:
                    data.write(b"\0" * (-data.tell() % ALIGNMENT))
                    stored[key] = (data.tell(), len(raw))
                    data.write(raw)
                offset, length = stored[key]
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
                del tensor.external_data[:]
                for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(length))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = k, v
            # Serialise directly: onnx.save_model would try to re-home external tensors.
            (directory / file_name).write_bytes(model.SerializeToString())
            written.append(file_name)
        data.flush()
        os.fsync(data.fileno())
    return [*written, data_name]
