"""ONNX Runtime on the CPU runs a stream's bucket graphs of a tower on one shape-dynamic session
(retrieval/backends/ort_batch.py, issue 34).

Each bucket session read one shared, unpacked copy of the weights, so batched shapes ran slower per
row than they could and 2–4 requests were padded up to bucket 8. These tests hold the rewritten
graph to each static bucket graph's answers on the real CN-CLIP architecture (models/cnclip-demo),
across batch and text length, a stream to one session for every shape that runs any batch size
unpadded, graphs that differ beyond their shape to a session each (with one log line), and the
memory budget's estimate to one copy per stream.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from retrieval.backends import ONNXRUNTIME, DeviceChoice, SessionConfig
from retrieval.backends.onnxruntime import OrtSession
from retrieval.backends.ort_batch import NotBatchLinear, dynamic_graph, input_shape
from retrieval.manifest import ModelManifest
from retrieval.sessions import BucketedSession
from retrieval.shared_weights import SharedWeights
from retrieval.toolchain.toy_model import write_toy_model
from retrieval.tower_plan import TowerPlan, plan_bytes
from tests.support.model_inputs import varied_input

DEMO = Path(__file__).resolve().parents[2] / "models" / "cnclip-demo"


def config(dynamic: bool = True) -> SessionConfig:
    """One stream's config (each has its own sessions: `SessionConfig.stream_models`)."""
    return SessionConfig(
        provider="cpu", precision="int8", cores=[0], weights=SharedWeights("t"), dynamic_shapes=dynamic
    )


def open_tower(directory: Path, tower: str, precision: str, dynamic: bool = True) -> dict[Path, OrtSession]:
    manifest = ModelManifest.load(directory)
    spec = manifest.towers[tower]
    stream = config(dynamic)
    paths = [manifest.graph_path(tower, precision, b) for b in manifest.towers[tower].buckets(precision)]
    return {p: OrtSession(p, stream, spec.input_name, spec.output_name) for p in paths}


@pytest.mark.parametrize(("tower", "precision"), [("text", "int8"), ("image", "int8"), ("image", "fp32")])
def test_the_one_session_answers_as_each_bucket_graph(tower: str, precision: str) -> None:
    dynamic = open_tower(DEMO, tower, precision)
    static = open_tower(DEMO, tower, precision, dynamic=False)
    for path, session in dynamic.items():
        batch = varied_input(tower, input_shape(path)[0], 52, seed=input_shape(path)[0])
        assert np.abs(session.run(batch) - static[path].run(batch)).max() < 1e-5, path.name
    one = {id(s._graphs.session_for(p)) for p, s in dynamic.items()}  # type: ignore[union-attr]
    assert len(one) == 1  # one InferenceSession for all five buckets


def test_any_batch_size_runs_unpadded_and_fp32_rows_do_not_depend_on_their_batch() -> None:
    sessions = open_tower(DEMO, "image", "fp32")
    bucketed = BucketedSession("image", {input_shape(p)[0]: s for p, s in sessions.items()})
    bucketed.any_batch = bucketed.any_batch_up_to()
    assert bucketed.any_batch == 32
    batch = varied_input("image", 5, 52, seed=1)
    alone = np.concatenate([bucketed.run(batch[i : i + 1]) for i in range(5)])
    together = bucketed.run(batch)  # 5 rows: no bucket of 5, none padded
    assert together.shape == (5, 128)
    assert np.abs(alone - together).max() < 1e-5
    # Without the dynamic session, a size between buckets is refused as before (the batcher pads it).
    per_bucket = open_tower(DEMO, "image", "fp32", dynamic=False)
    fixed = BucketedSession("image", {input_shape(p)[0]: s for p, s in per_bucket.items()})
    assert fixed.any_batch_up_to() == 0
    with pytest.raises(Exception, match="not a bucket"):
        fixed.run(batch)


def test_batch_and_text_length_both_vary_in_one_session(tmp_path: Path) -> None:
    manifest = write_toy_model(tmp_path, buckets=(1, 4), text_lengths=(16, 32))
    spec = manifest.towers["text"]
    stream = config()
    graphs = {
        (b, n): manifest.graph_path("text", "int8", b, n if n < manifest.context_length else None)
        for b in (1, 4)
        for n in (16, 32, manifest.context_length)
    }
    sessions = {key: OrtSession(path, stream, spec.input_name, spec.output_name) for key, path in graphs.items()}
    for (b, n), session in sessions.items():
        batch = varied_input("text", b, n, seed=b * n)
        own = SessionConfig(provider="cpu", precision="int8", cores=[0])
        static = OrtSession(graphs[b, n], own, spec.input_name, spec.output_name)
        assert np.abs(session.run(batch) - static.run(batch)).max() < 1e-5
    assert len({id(s._graphs.session_for(graphs[k])) for k, s in sessions.items()}) == 1  # type: ignore[union-attr]
    # A width between the length buckets and a batch between the batch buckets: one run, unpadded.
    assert sessions[1, 16].run(varied_input("text", 3, 24, seed=7)).shape[0] == 3


def test_graphs_that_differ_beyond_their_shape_get_a_session_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for path in DEMO.glob("text.fp32.*"):
        shutil.copy(path, tmp_path / path.name)
    shutil.copy(DEMO / "manifest.json", tmp_path / "manifest.json")
    b4 = tmp_path / "text.fp32.b4.onnx"
    model = onnx.load(str(b4), load_external_data=False)
    inline = next(t for t in model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL and t.dims == [])
    value = numpy_helper.to_array(inline)
    inline.CopyFrom(numpy_helper.from_array(np.asarray(value + np.asarray(1, value.dtype)), inline.name))
    onnx.save(model, str(b4))
    paths = {input_shape(p): p for p in (tmp_path / "text.fp32.b1.onnx", b4)}
    with pytest.raises(NotBatchLinear, match="not a function of the shape"):
        dynamic_graph(paths)
    stream = config()
    sessions = [OrtSession(p, stream, "text", "text_features") for p in paths.values()]
    with caplog.at_level(logging.INFO, logger="retrieval.backends.onnxruntime"):
        out = sessions[1].run(varied_input("text", 4, 52, seed=3))
    assert out.shape == (4, 128)
    assert sum("cannot share one session" in r.getMessage() for r in caplog.records) == 1
    assert sessions[0]._graphs.session_for(sessions[0]._path) is not sessions[1]._graphs.session_for(b4)  # type: ignore[union-attr]
    assert sessions[0].any_batch_up_to() == 0  # bucket sizes only: the batcher pads as before


def test_the_memory_budget_counts_one_copy_per_stream() -> None:
    def plan(dynamic: bool, streams: int) -> TowerPlan:
        return TowerPlan(
            tower="text",
            backend=ONNXRUNTIME,
            device=DeviceChoice("cpu", "test"),
            precision="int8",
            graph="int8",
            buckets=[1, 4, 8, 16, 32],
            share=True,
            streams=streams,
            dynamic=dynamic,
        )

    assert plan_bytes(plan(True, 1), shapes=10, copy_bytes=100) == 100
    assert plan_bytes(plan(True, 2), shapes=10, copy_bytes=100) == 200
    assert plan_bytes(plan(False, 2), shapes=10, copy_bytes=100) == 100  # one shared copy, nothing prepacked
    assert "one shape-dynamic session" in plan(True, 1).weights_words()
