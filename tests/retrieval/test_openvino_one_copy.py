"""OpenVINO serves a stream's batch buckets from one compiled model (retrieval/backends/openvino_batch.py).

Each bucket graph compiled on its own kept its own copy of the weights (six ViT-B-16 int8 text shapes:
1,785 MB, issue 34). These tests hold the rewrite to the static graphs' answers on the real CN-CLIP
architecture (models/cnclip-demo), to about one compiled copy of memory for all buckets (a fresh
process), to per-bucket compiles where graphs differ beyond their shape, to one calibration for
buckets NNCF calibrated apart, and the memory budget's estimate to one copy per stream.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from retrieval.backends import ONNXRUNTIME, OPENVINO, DeviceChoice, SessionConfig
from retrieval.backends.openvino import OpenVinoSession, compile_properties
from retrieval.backends.openvino_batch import NotBatchLinear, dynamic_model
from retrieval.graph_store import save_sharing_weights
from retrieval.manifest import ModelManifest
from retrieval.sessions import BucketedSession
from retrieval.text_lengths import used_lengths
from retrieval.tokenizer import tokenize
from retrieval.toolchain.toy_model import write_toy_model
from retrieval.tower_plan import TowerPlan, plan_bytes
from tests.support.model_inputs import varied_input

pytest.importorskip("openvino")
import openvino as ov  # noqa: E402

DEMO = Path(__file__).resolve().parents[2] / "models" / "cnclip-demo"
CPU = SessionConfig(provider="CPU", precision="fp32", cores=[0], backend="openvino", run_precision="fp32")


def stream_config() -> SessionConfig:
    """One stream's config: each has its own compiled models (`SessionConfig.stream_models`)."""
    return SessionConfig(provider="CPU", precision="fp32", cores=[0], backend="openvino", run_precision="fp32")


def static_answer(path: Path, batch: np.ndarray, name: str) -> np.ndarray:
    """What the bucket graph gives compiled on its own (the way every bucket was compiled before)."""
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", compile_properties(CPU))
    return np.array(compiled.create_infer_request().infer({name: batch})[0])


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


@pytest.mark.parametrize("tower", ["image", "text"])
def test_every_bucket_of_a_cnclip_tower_runs_on_one_compiled_model_with_the_static_answers(tower: str) -> None:
    manifest = ModelManifest.load(DEMO, verify=False)
    spec = manifest.towers[tower]
    config = stream_config()
    buckets = spec.buckets("fp32")
    paths = {b: manifest.graph_path(tower, "fp32", b) for b in buckets}
    sessions = {b: OpenVinoSession(p, config, spec.input_name, spec.output_name) for b, p in paths.items()}
    for b, session in sessions.items():
        batch = varied_input(tower, b, manifest.context_length, seed=b)
        got = session.run(batch)
        assert got.shape == (b, manifest.embed_dim)
        assert min_cosine(got, static_answer(paths[b], batch, spec.input_name)) >= 0.9999, b
    assert len({id(s.compiled_model) for s in sessions.values()}) == 1, "one compiled model for every bucket"
    assert len(buckets) >= 3


def test_any_batch_size_and_any_text_width_run_unpadded_on_the_one_model(tmp_path: Path) -> None:
    manifest = ModelManifest.load(DEMO, verify=False)
    spec = manifest.towers["image"]
    config = stream_config()
    images = {b: OpenVinoSession(manifest.graph_path("image", "fp32", b), config, spec.input_name, spec.output_name)
              for b in spec.buckets("fp32")}  # fmt: skip
    bucketed = BucketedSession("image", images)
    bucketed.any_batch = bucketed.any_batch_up_to()
    assert bucketed.any_batch == 32
    batch = varied_input("image", 5, 52, seed=1)
    alone = np.concatenate([bucketed.run(batch[i : i + 1]) for i in range(5)])
    together = bucketed.run(batch)  # 5 rows: no bucket of 5, none padded
    assert together.shape == (5, manifest.embed_dim)
    assert min_cosine(alone, together) >= 0.99999
    # Text: a model over two length buckets runs a text at its own width, below the shortest too.
    toy = write_toy_model(tmp_path / "toy", buckets=(1, 4), text_lengths=(16, 32))
    text = toy.towers["text"]
    stream = stream_config()
    texts = [OpenVinoSession(toy.graph_path("text", "fp32", b, n), stream, text.input_name, text.output_name)
             for b in (1, 4) for n in (16, 32, None)]  # fmt: skip
    assert texts[0].any_length_up_to() == 52 and texts[0].any_batch_up_to() == 4
    ids = tokenize(["猫", "穿红色裙子的女孩", "一只在草地上奔跑的小狗和它的主人" * 2], 52)
    for row, used in zip(ids, used_lengths(ids), strict=True):
        bucket = next(n for n in (16, 32, 52) if n >= used)
        at_bucket = texts[0].run(row[None, :bucket])
        for width in {int(used), (int(used) + bucket) // 2}:
            assert min_cosine(texts[0].run(row[None, :width]), at_bucket) >= 0.99999, (int(used), width)
    # Compiled per bucket (graphs that are not one graph) a session runs its own shape only.
    apart = write_mlp_buckets(tmp_path / "apart", (1, 4), scale_by_batch=True)
    own = {b: OpenVinoSession(p, stream_config(), "x", "y") for b, p in apart.items()}
    assert [s.any_batch_up_to() for s in own.values()] == [0, 0]


def test_every_batch_and_text_length_of_a_stream_shares_one_model_and_streams_never_share(tmp_path: Path) -> None:
    manifest = write_toy_model(tmp_path / "toy", buckets=(1, 4, 8), text_lengths=(16,))
    spec = manifest.towers["text"]
    opened = []
    for config in (stream_config(), stream_config()):
        for length in (16, None):
            for b in (1, 4, 8):
                path = manifest.graph_path("text", "fp32", b, length)
                session = OpenVinoSession(path, config, spec.input_name, spec.output_name)
                opened.append((config, length, b, path, session))
    for _, length, b, path, session in opened:
        batch = varied_input("text", b, length or 52, seed=b)
        assert min_cosine(session.run(batch), static_answer(path, batch, spec.input_name)) >= 0.9999
    per_stream: dict[int, dict[int | None, set[int]]] = {}
    for config, length, _, _, session in opened:
        per_stream.setdefault(id(config), {}).setdefault(length, set()).add(id(session.compiled_model))
    models = [set().union(*by_length.values()) for by_length in per_stream.values()]
    assert [len(by_length) for by_length in per_stream.values()] == [2, 2]  # both lengths opened...
    assert [len(ids) for ids in models] == [1, 1]  # ...on one model per stream
    assert not models[0] & models[1]  # each stream its own


# --- a graph big enough to weigh: per-bucket static graphs like the converter's --------------------
WIDTH, HIDDEN, LAYERS, TOKENS = 512, 2048, 12, 16


def _mlp_graph(
    batch: int, weights: list[np.ndarray], cls: np.ndarray, scale: float = 1.0, act_scale: float | None = None
) -> onnx.ModelProto:
    """x [b, TOKENS, WIDTH] → class token prepended (stored broadcast to the batch, as the export does) →
    reshaped by constant [b·(T+1), W] targets → (`act_scale`: int8 QuantizeLinear/DequantizeLinear, as
    NNCF writes them) → MLP blocks → mean over tokens [b, W]."""
    rows = batch * (TOKENS + 1)
    inits = [
        numpy_helper.from_array(np.broadcast_to(cls, (batch, 1, WIDTH)).copy(), "cls"),
        numpy_helper.from_array(np.array([rows, WIDTH], np.int64), "flat"),
        numpy_helper.from_array(np.array([batch, TOKENS + 1, WIDTH], np.int64), "unflat"),
        numpy_helper.from_array(np.array([scale], np.float32), "scale"),
    ]
    nodes = [
        helper.make_node("Concat", ["cls", "x"], ["seq"], axis=1),
        helper.make_node("Reshape", ["seq", "flat"], ["flat_seq"]),
    ]
    if act_scale is None:
        nodes.append(helper.make_node("Identity", ["flat_seq"], ["h0"]))
    else:
        inits += [
            numpy_helper.from_array(np.array(act_scale, np.float32), "act_scale"),
            numpy_helper.from_array(np.array(0, np.int8), "act_zero"),
        ]
        nodes += [
            helper.make_node("QuantizeLinear", ["flat_seq", "act_scale", "act_zero"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "act_scale", "act_zero"], ["h0"]),
        ]
    for i in range(LAYERS):
        up, down = weights[2 * i], weights[2 * i + 1]
        inits += [numpy_helper.from_array(up, f"up{i}"), numpy_helper.from_array(down, f"down{i}")]
        nodes += [
            helper.make_node("MatMul", [f"h{i}", f"up{i}"], [f"u{i}"]),
            helper.make_node("Relu", [f"u{i}"], [f"r{i}"]),
            helper.make_node("MatMul", [f"r{i}", f"down{i}"], [f"d{i}"]),
            helper.make_node("Add", [f"h{i}", f"d{i}"], [f"h{i + 1}"]),
        ]
    nodes += [
        helper.make_node("Mul", [f"h{LAYERS}", "scale"], ["scaled"]),
        helper.make_node("Reshape", ["scaled", "unflat"], ["back"]),
        helper.make_node("ReduceMean", ["back"], ["y"], axes=[1], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, TOKENS, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, WIDTH])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def write_mlp_buckets(
    directory: Path, buckets: tuple[int, ...], scale_by_batch: bool = False, calibrated_apart: bool = False
) -> dict[int, Path]:
    """Bucket graphs sharing one weight file (~100 MB fp32); `scale_by_batch`: a constant that differs
    per bucket in a way that is not the batch's (the graphs are then not one graph); `calibrated_apart`:
    int8 activations with another range per bucket, as NNCF calibrates each bucket graph on its own."""
    rng = np.random.default_rng(0)
    weights = [
        (rng.normal(0, 0.02, shape)).astype(np.float32)
        for _ in range(LAYERS)
        for shape in ((WIDTH, HIDDEN), (HIDDEN, WIDTH))
    ]
    cls = rng.normal(0, 1, (1, 1, WIDTH)).astype(np.float32)
    graphs = {
        f"mlp.b{b}.onnx": _mlp_graph(
            b,
            weights,
            cls,
            scale=1.0 + (0.5 * b if scale_by_batch else 0.0),
            act_scale=0.02 * (1 + 0.05 * b) if calibrated_apart else None,
        )
        for b in buckets
    }
    directory.mkdir(parents=True, exist_ok=True)
    save_sharing_weights(graphs, directory, "mlp.data")
    return {b: directory / f"mlp.b{b}.onnx" for b in buckets}


def test_graphs_that_differ_beyond_the_batch_are_compiled_per_bucket_with_their_own_answers(tmp_path: Path) -> None:
    paths = write_mlp_buckets(tmp_path, (1, 4), scale_by_batch=True)
    core = ov.Core()
    base = core.read_model(str(paths[1]))
    with pytest.raises(NotBatchLinear, match="not a function of the shape"):
        dynamic_model({(1, TOKENS, WIDTH): base, (4, TOKENS, WIDTH): core.read_model(str(paths[4]))})
    assert base.inputs[0].get_partial_shape().is_static  # left as it was: still compiles per bucket
    config = stream_config()
    sessions = {b: OpenVinoSession(p, config, "x", "y") for b, p in paths.items()}
    for b, session in sessions.items():
        x = np.random.default_rng(b).normal(0, 1, (b, TOKENS, WIDTH)).astype(np.float32)
        assert min_cosine(session.run(x), static_answer(paths[b], x, "x")) >= 0.9999
        assert np.allclose(np.linalg.norm(session.run(x)), np.linalg.norm(static_answer(paths[b], x, "x")), rtol=1e-4)
    assert sessions[1].compiled_model is not sessions[4].compiled_model


def test_buckets_calibrated_apart_all_run_the_smallest_buckets_calibration_on_one_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paths = write_mlp_buckets(tmp_path, (1, 4, 8), calibrated_apart=True)
    config = stream_config()
    sessions = {b: OpenVinoSession(p, config, "x", "y") for b, p in paths.items()}
    x = np.random.default_rng(5).normal(0, 1, (8, TOKENS, WIDTH)).astype(np.float32)
    with caplog.at_level("INFO", logger="retrieval.backends.openvino"):
        rows_alone = np.concatenate([static_answer(paths[1], x[i : i + 1], "x") for i in range(8)])
        for b, session in sessions.items():
            got = session.run(x[:b])
            # Each row as the batch-1 graph (its calibration) gives it alone: no longer bucket-dependent.
            assert min_cosine(got, rows_alone[:b]) >= 0.9999, b
            if b > 1:  # and not what this bucket's own calibration gives: the rule did something
                assert not np.allclose(got, static_answer(paths[b], x[:b], "x"), rtol=1e-4, atol=1e-6)
    assert len({id(s.compiled_model) for s in sessions.values()}) == 1
    said = [r.getMessage() for r in caplog.records]
    assert any("were calibrated apart; all run the calibration of the [1, 16, 512] graph" in m for m in said), said


MEASURE = """
import json, sys
from pathlib import Path
import numpy as np
import openvino as ov
from retrieval.backends.base import SessionConfig
from retrieval.backends.openvino import OpenVinoSession, _core
from retrieval.toolchain.tune.memory import rss_mb

paths = {int(b): Path(p) for b, p in json.loads(sys.argv[1]).items()}
# The plugin loaded and warm before the first reading: only the graphs' own memory is charged.
x = ov.opset13.parameter([1], ov.Type.f32)
_core().compile_model(ov.Model([ov.opset13.relu(x)], [x]), "CPU")
before = rss_mb()
config = SessionConfig(provider="CPU", precision="fp32", cores=[0], backend="openvino", run_precision="fp32")
sessions = {b: OpenVinoSession(p, config, "x", "y") for b, p in paths.items()}
for b, session in sessions.items():
    session.run(np.zeros((b, 16, 512), np.float32))
print(json.dumps({"mb": rss_mb() - before}))
"""


def _opened_mb(paths: dict[int, Path]) -> float:
    """Resident growth of a fresh process that opens and runs `paths` as one stream's buckets."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps({b: str(p) for b, p in paths.items()})],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    return float(json.loads(done.stdout.strip().splitlines()[-1])["mb"])


def test_opening_every_bucket_of_a_tower_takes_about_one_compiled_copy(tmp_path: Path) -> None:
    paths = write_mlp_buckets(tmp_path, (1, 4, 8, 16))
    weights_mb = (tmp_path / "mlp.data").stat().st_size / 2**20
    one = _opened_mb({1: paths[1]})
    every = _opened_mb(paths)
    assert one >= 0.5 * weights_mb, (one, weights_mb)  # a copy is there to weigh (~96 MB of weights)
    assert every < 1.5 * one, f"4 buckets took {every:.0f} MB, one took {one:.0f} MB"
    # The measurement tells the two apart: compiled per bucket (graphs that are not one graph), 4 copies.
    apart = _opened_mb(write_mlp_buckets(tmp_path / "apart", (1, 4, 8, 16), scale_by_batch=True))
    assert apart > 2.5 * one, f"per bucket: {apart:.0f} MB, one bucket {one:.0f} MB"


def test_the_memory_budget_counts_one_openvino_cpu_copy_per_stream() -> None:
    def plan(backend, device: str, streams: int) -> TowerPlan:  # type: ignore[no-untyped-def]
        return TowerPlan(
            "text", backend, DeviceChoice(device, ""), "int8", "int8-qdq", [1, 8, 16], share=False, streams=streams
        )

    six_shapes, copy = 6, 100  # buckets 1/8/16 at lengths 16 and 52
    assert plan_bytes(plan(OPENVINO, "CPU", 1), six_shapes, copy) == copy
    assert plan_bytes(plan(OPENVINO, "CPU", 2), six_shapes, copy) == 2 * copy
    assert plan_bytes(plan(OPENVINO, "GPU", 1), six_shapes, copy) == 6 * copy  # compiled per bucket there
    assert plan_bytes(plan(ONNXRUNTIME, "cpu", 1), six_shapes, copy) == 6 * copy  # prepacked, unshared
    assert "one compiled copy per stream" in plan(OPENVINO, "CPU", 1).weights_words()
