"""One copy of the weights per tower and precision: shared sessions answer as unshared ones do, on
the toy model and on a converted (random-init) demo-config model, for every bucket; the encoder
makes one `SharedWeights` per tower and precision; a failure to share falls back with a log line.
Memory itself is measured by benchmarks/bench_memory.py, not here."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from api.config import Settings
from cli.main import build_cli
from retrieval import shared_weights
from retrieval.backends.base import SessionConfig
from retrieval.backends.onnxruntime import ort_session_options, weight_sharing
from retrieval.config import REPO_ROOT
from retrieval.encoder import LocalEncoder
from retrieval.graph_store import save_sharing_weights
from retrieval.manifest import ModelManifest
from retrieval.sessions import OrtSession
from retrieval.shared_weights import SharedWeights

RUNTIME_FAIL = ort.capi.onnxruntime_pybind11_state.Fail


@pytest.fixture(scope="module")
def converted_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`cnclip convert --config demo/model_config.json --random-init`, fp32 and int8, buckets 1 and 4."""
    out = tmp_path_factory.mktemp("demo-random") / "model"
    result = CliRunner().invoke(
        build_cli(),
        ["convert", "--config", str(REPO_ROOT / "demo" / "model_config.json"), "--random-init", "--out", str(out)]
        + ["--buckets", "1,4", "--precision", "fp32,int8"],
    )
    assert result.exit_code == 0, result.output
    return out


def sample(session: OrtSession, tower: str, bucket: int, manifest: ModelManifest) -> np.ndarray:
    rng = np.random.default_rng(bucket)
    if tower == "text":
        ids = rng.integers(106, 8000, (bucket, manifest.context_length), dtype=np.int64)
        ids[:, 0], ids[:, -1] = 101, 102
        return ids
    return rng.standard_normal((bucket, 3, manifest.image_size, manifest.image_size)).astype(np.float32)


def stored_tensors(graphs: list[Path]) -> set[tuple[str, str, str]]:
    """(file, offset, length) of every external initializer the graphs point at."""
    found = set()
    for path in graphs:
        for tensor in onnx.load(str(path), load_external_data=False).graph.initializer:
            if tensor.data_location == TensorProto.EXTERNAL:
                info = {e.key: e.value for e in tensor.external_data}
                found.add((info["location"], info["offset"], info["length"]))
    return found


def check_every_bucket(model_dir: Path) -> None:
    manifest = ModelManifest.load(model_dir)
    for tower, spec in manifest.towers.items():
        for precision in spec.precisions():
            weights = SharedWeights(f"{tower}/{precision}")
            shared_config = SessionConfig(provider="cpu", precision=precision, cores=[0], weights=weights)
            own_config = SessionConfig(provider="cpu", precision=precision, cores=[0])
            graphs = [manifest.graph_path(tower, precision, b) for b in spec.buckets(precision)]
            for bucket, path in zip(spec.buckets(precision), graphs, strict=True):
                shared = OrtSession(path, shared_config, spec.input_name, spec.output_name)
                own = OrtSession(path, own_config, spec.input_name, spec.output_name)
                # The same kernels as the shared session (no prepacking), with weights loaded by ORT itself.
                same_kernels = ort.InferenceSession(str(path), ort_session_options(shared_config))
                batch = sample(shared, tower, bucket, manifest)
                out = shared.run(batch)
                where = f"{tower}/{precision}/b{bucket}"
                assert shared.weights is weights, where
                assert np.array_equal(out, same_kernels.run([spec.output_name], {spec.input_name: batch})[0]), where
                # Prepacked kernels round differently in the last bits, no more.
                assert np.abs(out - own.run(batch)).max() < 1e-5, where
            assert weights.usable and weights.sessions == len(graphs)
            # One OrtValue per stored tensor, whatever the number of buckets.
            assert weights.tensors == len(stored_tensors(graphs)) > 0
            data = {f for f, _, _ in stored_tensors(graphs)}
            assert weights.nbytes <= sum((model_dir / f).stat().st_size for f in data)


def test_shared_sessions_answer_as_unshared_ones_on_the_toy_model(toy_model_dir: Path) -> None:
    check_every_bucket(toy_model_dir)


def test_shared_sessions_answer_as_unshared_ones_on_a_converted_model(converted_demo: Path) -> None:
    check_every_bucket(converted_demo)


def test_buckets_share_by_storage_not_by_name(tmp_path: Path) -> None:
    # Bucket graphs hold batch-shaped constants under one name with different bytes (ViT's class
    # token broadcast to the batch); handing one bucket's tensor to another would break it.
    graphs = {}
    for batch in (2, 3):
        constant = np.full((batch, 300), batch, dtype=np.float32)
        graph = helper.make_graph(
            [helper.make_node("Add", ["x", "c"], ["y"])],
            f"b{batch}",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 300])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 300])],
            [numpy_helper.from_array(constant, "c")],
        )
        graphs[f"g.b{batch}.onnx"] = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    save_sharing_weights(graphs, tmp_path, "g.data")
    weights = SharedWeights("g/fp32")
    config = SessionConfig(provider="cpu", precision="fp32", weights=weights)
    for batch in (2, 3):
        session = OrtSession(tmp_path / f"g.b{batch}.onnx", config, "x", "y")
        assert session.weights is weights
        assert np.array_equal(session.run(np.zeros((batch, 300), np.float32)), np.full((batch, 300), batch))
    assert weights.tensors == 2 and weights.sessions == 2


def test_session_options_with_shared_weights() -> None:
    lean = ort_session_options(SessionConfig(provider="cpu", precision="int8", weights=SharedWeights("text/int8")))
    assert lean.get_session_config_entry("session.disable_prepacking") == "1"
    assert lean.enable_cpu_mem_arena is False
    default = ort_session_options(SessionConfig(provider="cpu", precision="int8"))
    assert default.enable_cpu_mem_arena is True
    with pytest.raises(Exception, match="disable_prepacking"):
        default.get_session_config_entry("session.disable_prepacking")


def test_weights_are_shared_on_cpu_only_and_only_when_asked() -> None:
    assert weight_sharing("cpu", True)[0]
    for provider in ("cuda", "cann"):
        shared, why = weight_sharing(provider, True)
        assert not shared and provider in why
    shared, why = weight_sharing("cpu", False)
    assert not shared and "CNCLIP_SHARE_WEIGHTS=false" in why


def opened_configs(settings: Settings) -> list[tuple[str, SessionConfig]]:
    opened: list[tuple[str, SessionConfig]] = []

    def factory(path: Path, config: SessionConfig, input_name: str, output_name: str) -> OrtSession:
        opened.append((path.name.split(".")[0], config))
        return OrtSession(path, config, input_name, output_name)

    async def main() -> None:
        encoder = LocalEncoder(settings, session_factory=factory)
        await encoder.start()
        await encoder.close()

    asyncio.run(main())
    return opened


def test_the_encoder_makes_one_shared_weights_per_tower_and_precision(settings: Settings) -> None:
    # A session per bucket (CNCLIP_DYNAMIC_SHAPES=false): the mode whose sessions share one copy.
    opened = opened_configs(settings.model_copy(update={"streams": 2, "buckets": [1, 4], "dynamic_shapes": False}))
    assert len(opened) == 2 * 2 * 2  # towers x streams x buckets
    by_tower = {tower: {id(c.weights) for t, c in opened if t == tower} for tower in ("image", "text")}
    assert all(len(ids) == 1 for ids in by_tower.values()) and by_tower["image"] != by_tower["text"]
    labels = {c.weights.label for _, c in opened if c.weights is not None}
    assert labels == {"image/int8", "text/int8"}
    assert all(c.weights is not None and c.weights.sessions == 4 for _, c in opened)
    unshared = opened_configs(settings.model_copy(update={"share_weights": False}))
    assert unshared and all(c.weights is None for _, c in unshared)


@pytest.mark.parametrize("failure", ["not shareable", "onnxruntime refuses"])
def test_a_failure_to_share_falls_back_with_one_log_line(
    failure: str, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if failure == "not shareable":
        monkeypatch.setattr(shared_weights, "NUMPY_TYPES", {})
    else:
        # ONNX Runtime accepts every initializer it is handed (their types and shapes come from the
        # graph itself); a provider that refused them would fail like this.
        real = ort.InferenceSession

        def refusing(path: str, sess_options: ort.SessionOptions, **kwargs: object) -> ort.InferenceSession:
            if sess_options.enable_cpu_mem_arena is False:  # the shared-weights options
                raise RUNTIME_FAIL("[ONNXRuntimeError] : 1 : FAIL : shared initializers not supported")
            return real(path, sess_options, **kwargs)

        monkeypatch.setattr(ort, "InferenceSession", refusing)
    manifest = ModelManifest.load(toy_model_dir)
    spec = manifest.towers["text"]
    weights = SharedWeights("text/fp32")
    config = SessionConfig(provider="cpu", precision="fp32", cores=[0], weights=weights)
    caplog.set_level(logging.WARNING, logger="retrieval.sessions")
    sessions = [
        OrtSession(manifest.graph_path("text", "fp32", b), config, spec.input_name, spec.output_name) for b in (1, 4)
    ]
    own = OrtSession(manifest.graph_path("text", "fp32", 4), config.unshared(), spec.input_name, spec.output_name)
    warnings = [r.getMessage() for r in caplog.records if r.name == "retrieval.sessions"]
    assert len(warnings) == 1 and "text/fp32: cannot share weights" in warnings[0]
    assert not weights.usable and weights.sessions == 0 and all(s.weights is None for s in sessions)
    batch = sample(sessions[1], "text", 4, manifest)
    assert np.array_equal(sessions[1].run(batch), own.run(batch))
    assert "not shared" in weights.summary()


def load_bench_memory():
    path = REPO_ROOT / "benchmarks" / "bench_memory.py"
    spec = importlib.util.spec_from_file_location("bench_memory", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_memory_smoke_run_on_the_toy_model(toy_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench_memory()
    bench.main(["serve", "--model", str(toy_model_dir), "--buckets", "1,4", "--modes", "share,no-share"])
    out = capsys.readouterr().out
    assert "weight files: 6," in out  # 2 towers x 2 buckets, and 2 data files
    assert "text/int8: 2 session(s) share one copy of the weights" in out
    assert "not shared (CNCLIP_SHARE_WEIGHTS=false)" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("share ", "no-share "))]
    assert [(r[0], r[1]) for r in rows] == [("share", "ready"), ("share", "after"), ("no-share", "ready")] + [
        ("no-share", "after")
    ]
    bench.main(["latency", "--model", str(toy_model_dir), "--precision", "fp32", "--rounds", "1", "--reps", "1"])
    out = capsys.readouterr().out
    assert "batch  1: own copy" in out and "batch  8: own copy" in out
