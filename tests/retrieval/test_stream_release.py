"""A stream's compiled models and sessions go with its last session, without waiting for a garbage
collection: the stream's registry (`SessionConfig.stream_models`) and what it holds formed a reference
cycle, so every OpenVINO shape the quality gate opened kept its compiled model (735 MB each for
ViT-B-16's text tower; `cnclip convert` peaked at 19.4 GB, issue 34) until the collector ran.
Checked with the collector off, on the demo model, for both backends' stream registries."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from retrieval.backends import SessionConfig
from retrieval.backends.onnxruntime import OrtSession
from retrieval.backends.openvino import OpenVinoSession
from retrieval.manifest import ModelManifest
from retrieval.shared_weights import SharedWeights
from tests.support.model_inputs import varied_input

DEMO = Path(__file__).resolve().parents[2] / "models" / "cnclip-demo"


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def stream_registry(opener: type, config: SessionConfig) -> weakref.ref:  # type: ignore[type-arg]
    """Open and run every text bucket of the demo model on one stream; a weak reference to the
    stream's registry entry (what holds its compiled model or session), the sessions dropped."""
    manifest = ModelManifest.load(DEMO, verify=False)
    spec = manifest.towers["text"]
    paths = [manifest.graph_path("text", config.precision, b) for b in spec.buckets(config.precision)]
    sessions = [opener(p, config, spec.input_name, spec.output_name) for p in paths]
    for session in sessions:
        session.run(varied_input("text", 1 if session is sessions[0] else 8, 52, seed=1)[:1])
    [graphs] = config.stream_models.values()
    return weakref.ref(graphs)


@pytest.mark.usefixtures("no_collector")
@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_streams_models_go_with_its_sessions_without_a_collection(backend: str) -> None:
    if backend == "openvino":
        pytest.importorskip("openvino")
        config = SessionConfig(provider="CPU", precision="fp32", cores=[0], backend="openvino", run_precision="fp32")
        graphs = stream_registry(OpenVinoSession, config)
    else:
        config = SessionConfig(
            provider="cpu", precision="int8", cores=[0], weights=SharedWeights("t"), dynamic_shapes=True
        )
        graphs = stream_registry(OrtSession, config)
    assert graphs() is not None  # the stream's config holds it
    del config
    assert graphs() is None  # freed by reference counting alone
