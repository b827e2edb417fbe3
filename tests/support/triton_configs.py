"""Triton's model configuration, read as Triton reads it (strictly, by its own protobuf schema), and the
exported Python models loaded from their files, for the tests of `cnclip export-triton` and the real Triton."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path
from typing import Any

import tritonclient
from google.protobuf import text_format


def load_by_path(name: str, path: Path) -> types.ModuleType:
    """The Python file at `path` as a module named `name` (an exported `model.py` is no package's module)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# tritonclient ships Triton's ModelConfig schema (model_config_pb2) even without its grpc extra; its
# package __init__ needs grpcio, so the generated module is loaded by path (it needs only protobuf).
model_config_pb2 = load_by_path(
    "triton_model_config_pb2", Path(tritonclient.__file__).parent / "grpc" / "model_config_pb2.py"
)


def parse_config(path: Path) -> Any:
    """Parse strictly: an unknown field, a wrong type or a bad enum value raises."""
    return text_format.Parse(path.read_text(encoding="utf-8"), model_config_pb2.ModelConfig())
