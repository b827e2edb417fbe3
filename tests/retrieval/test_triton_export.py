"""`cnclip export-triton`: configs parse as Triton's ModelConfig, graphs batch dynamically (or stay
static for npu_ge) and agree with the bucket graphs, and the preprocess model equals ours."""

from __future__ import annotations

import io
import json
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import json_format
from onnx import TensorProto, helper, numpy_helper
from PIL import Image
from typer.testing import CliRunner

from cli.main import build_cli
from retrieval.errors import InvalidInput, ModelError
from retrieval.manifest import ModelManifest, TowerSpec
from retrieval.preprocess import preprocess_image
from retrieval.tokenizer import tokenize
from retrieval.toolchain.triton.export import ExportOptions, export_triton_repository
from retrieval.toolchain.triton.graphs import dynamic_batch_graph
from tests.support.kserve_server import image_file
from tests.support.triton_configs import load_by_path, model_config_pb2, parse_config

MODELS = ("cnclip_text", "cnclip_image", "preprocess", "cnclip_image_bytes")


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def repo(toy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("triton") / "repo"
    options = ExportOptions(instances=3, max_batch=16, queue_delay_us=2500)
    report = export_triton_repository(toy_model_dir, out, options)
    assert report.models == list(MODELS) and report.batch == {"cnclip_text": 16, "cnclip_image": 16}
    return out


@pytest.fixture(scope="module")
def ge_repo(toy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("triton-ge") / "repo"
    options = ExportOptions(backend="npu_ge", instances=4, max_batch=8, aicore="12|10", device_ids=(0, 1))
    export_triton_repository(toy_model_dir, out, options)
    return out


def test_onnxruntime_configs_parse_as_model_config(repo: Path) -> None:
    configs = {name: parse_config(repo / name / "config.pbtxt") for name in MODELS}
    text, image = configs["cnclip_text"], configs["cnclip_image"]
    assert (text.name, text.backend, text.max_batch_size) == ("cnclip_text", "onnxruntime", 16)
    assert [(i.name, i.data_type, list(i.dims)) for i in text.input] == [("text", model_config_pb2.TYPE_INT64, [52])]
    assert [(o.name, list(o.dims)) for o in text.output] == [("text_features", [32])]
    assert [(i.name, i.data_type, list(i.dims)) for i in image.input] == [
        ("image", model_config_pb2.TYPE_FP32, [3, 224, 224])
    ]
    for tower in (text, image):
        assert tower.WhichOneof("scheduling_choice") == "dynamic_batching"
        assert list(tower.dynamic_batching.preferred_batch_size) == [4, 8, 16]  # the buckets within max_batch
        assert tower.dynamic_batching.max_queue_delay_microseconds == 2500
        assert [g.count for g in tower.instance_group] == [3]
        assert tower.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_AUTO
        assert not tower.parameters

    # The image pipeline batches end to end: preprocess, image model and ensemble share max_batch_size.
    pre = configs["preprocess"]
    assert (pre.backend, pre.max_batch_size) == ("python", 16)
    assert [(i.name, i.data_type, list(i.dims)) for i in pre.input] == [
        ("image_bytes", model_config_pb2.TYPE_STRING, [1])
    ]
    assert list(pre.output[0].dims) == [3, 224, 224]
    assert pre.parameters["interpolation"].string_value == "bicubic"
    assert json.loads(pre.parameters["mean"].string_value) == [0.48145466, 0.4578275, 0.40821073]

    ensemble = configs["cnclip_image_bytes"]
    assert ensemble.platform == "ensemble"
    steps = ensemble.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["preprocess", "cnclip_image"]
    # The tensors chain: ensemble input → preprocess → cnclip_image → ensemble output.
    assert dict(steps[0].input_map) == {"image_bytes": ensemble.input[0].name}
    assert dict(steps[1].input_map) == {"image": steps[0].output_map["image"]}
    assert dict(steps[1].output_map) == {"image_features": ensemble.output[0].name}
    assert ensemble.max_batch_size == 16
    assert list(ensemble.input[0].dims) == [1] and list(ensemble.output[0].dims) == [32]
    for name in MODELS:
        assert (repo / name / "1").is_dir()


def test_npu_ge_config_is_static_with_core_locking(ge_repo: Path) -> None:
    for name, dims in (("cnclip_text", [8, 52]), ("cnclip_image", [8, 3, 224, 224])):
        config = parse_config(ge_repo / name / "config.pbtxt")
        assert (config.backend, config.max_batch_size) == ("npu_ge", 0)
        assert list(config.input[0].dims) == dims and list(config.output[0].dims) == [8, 32]
        # static_model excludes dynamic batching: no scheduling block at all.
        assert config.WhichOneof("scheduling_choice") is None
        assert {k: v.string_value for k, v in config.parameters.items()} == {
            "static_model": "true",
            "ge.aicoreNum": "12|10",
            "device_ids": "0,1",
        }
        assert config.instance_group[0].count == 4
    ensemble = parse_config(ge_repo / "cnclip_image_bytes" / "config.pbtxt")
    assert ensemble.max_batch_size == 0  # nothing in a static pipeline batches
    assert list(ensemble.input[0].dims) == [8] and list(ensemble.output[0].dims) == [8, 32]
    preprocess = parse_config(ge_repo / "preprocess" / "config.pbtxt")
    assert preprocess.max_batch_size == 0 and list(preprocess.input[0].dims) == [-1]
    # The static graph is the bucket graph itself: exactly 8 rows, nothing else.
    image = session(ge_repo / "cnclip_image" / "1" / "model.onnx")
    assert image.get_inputs()[0].shape == [8, 3, 224, 224]


def test_exported_graphs_take_any_batch_and_match_the_buckets(repo: Path, toy_model_dir: Path) -> None:
    manifest = ModelManifest.load(toy_model_dir)
    text = session(repo / "cnclip_text" / "1" / "model.onnx")
    assert text.get_inputs()[0].shape[0] == "batch" and text.get_inputs()[0].shape[1] == 52
    single = session(manifest.graph_path("text", "fp32", 1))
    ids = tokenize([f"第{i}张照片" for i in range(11)])
    expected = np.concatenate([single.run(None, {"text": ids[i : i + 1]})[0] for i in range(11)])
    for n in (1, 7, 11):
        np.testing.assert_allclose(text.run(None, {"text": ids[:n]})[0], expected[:n], atol=1e-5)
    # The graph is self-contained: no external-data file next to it.
    assert sorted(p.name for p in (repo / "cnclip_text" / "1").iterdir()) == ["model.onnx"]


def fake_python_backend(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Just enough of Triton's `triton_python_backend_utils` to run execute()."""
    pb = types.ModuleType("triton_python_backend_utils")

    class Tensor:
        def __init__(self, name: str, array: np.ndarray) -> None:
            self.name, self.array = name, array

        def as_numpy(self) -> np.ndarray:
            return self.array

    class TritonError:
        INVALID_ARG = 3

        def __init__(self, message: str, code: int = 0) -> None:
            self.message, self.code = message, code

    class InferenceResponse:
        def __init__(self, output_tensors: list[Tensor], error: TritonError | None = None) -> None:
            self.output_tensors, self.error = output_tensors, error

    pb.Tensor = Tensor  # type: ignore[attr-defined]
    pb.TritonError = TritonError  # type: ignore[attr-defined]
    pb.InferenceResponse = InferenceResponse  # type: ignore[attr-defined]
    pb.get_input_tensor_by_name = lambda request, name: request[name]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    return pb


def _modes() -> list[bytes]:
    files = [image_file((200, 40, 40)), image_file((30, 60, 200), size=(300, 120), fmt="JPEG")]
    rgba = Image.new("RGBA", (50, 70), (10, 200, 30, 128))
    grey16 = Image.fromarray((np.arange(40 * 30, dtype=np.uint16).reshape(30, 40) * 50).astype(np.uint16))
    for image in (rgba, rgba.convert("P"), rgba.convert("L"), grey16):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        files.append(buffer.getvalue())
    return files


def test_preprocess_model_equals_ours_and_feeds_the_image_model(
    repo: Path, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pb = fake_python_backend(monkeypatch)
    module = load_by_path("exported_preprocess", repo / "preprocess" / "1" / "model.py")
    model = module.TritonPythonModel()
    config = json_format.MessageToDict(
        parse_config(repo / "preprocess" / "config.pbtxt"), preserving_proto_field_name=True
    )
    model.initialize({"model_config": json.dumps(config)})
    files = _modes()
    batch = np.array(files, dtype=np.object_).reshape(-1, 1)  # [n, 1], as Triton batches dims [1]
    (response,) = model.execute([{"image_bytes": pb.Tensor("image_bytes", batch)}])
    assert response.error is None
    pixels = response.output_tensors[0].as_numpy()
    ours = np.stack([preprocess_image(f) for f in files])
    assert pixels.shape == (len(files), 3, 224, 224) and pixels.dtype == np.float32
    np.testing.assert_array_equal(pixels, ours)  # the very bits: one arithmetic, repeated
    # The check has teeth: the seed's BILINEAR resize gives values far from ours.
    bilinear = Image.open(io.BytesIO(files[1])).resize((224, 224), Image.Resampling.BILINEAR).convert("RGB")
    mean, std = model.mean, model.std
    bilinear_pixels = (np.asarray(bilinear, np.float32).transpose(2, 0, 1) / 255 - mean) / std
    assert np.abs(bilinear_pixels - ours[1]).max() > 0.05

    # The ensemble's second step on the first step's output equals the local image bucket graph.
    image = session(repo / "cnclip_image" / "1" / "model.onnx")
    bucket = session(ModelManifest.load(toy_model_dir).graph_path("image", "fp32", 1))
    expected = np.concatenate([bucket.run(None, {"image": ours[i : i + 1]})[0] for i in range(len(files))])
    np.testing.assert_allclose(image.run(None, {"image": pixels})[0], expected, atol=1e-5)


def test_preprocess_model_rejects_bad_images(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pb = fake_python_backend(monkeypatch)
    module = load_by_path("exported_preprocess_bad", repo / "preprocess" / "1" / "model.py")
    model = module.TritonPythonModel()
    config = json_format.MessageToDict(
        parse_config(repo / "preprocess" / "config.pbtxt"), preserving_proto_field_name=True
    )
    model.initialize({"model_config": json.dumps(config)})
    requests = [
        {"image_bytes": pb.Tensor("image_bytes", np.array([b"%PDF-1.4 not an image"], dtype=np.object_))},
        {"image_bytes": pb.Tensor("image_bytes", np.array([b""], dtype=np.object_))},
        {"image_bytes": pb.Tensor("image_bytes", np.array([image_file((1, 1, 1))[:60]], dtype=np.object_))},
    ]
    responses = model.execute(requests)
    assert [r.error.code for r in responses] == [pb.TritonError.INVALID_ARG] * 3
    assert all(r.error.message.startswith("image rejected: ") for r in responses)
    assert "empty" in responses[1].error.message


def _text_graph(batch: int, baked: str) -> onnx.ModelProto:
    """[b, 52] ids → [b, 4], with the batch baked into a Reshape (fixable) or an Expand (not)."""
    nodes = [helper.make_node("Cast", ["text"], ["f"], to=TensorProto.FLOAT)]
    inits = [numpy_helper.from_array(np.ones((52, 4), np.float32) / 52, "w")]
    if baked == "reshape":
        nodes += [
            helper.make_node("Reshape", ["f", "flat_shape"], ["flat"]),
            helper.make_node("MatMul", ["flat", "w"], ["text_features"]),
        ]
        inits.append(numpy_helper.from_array(np.array([batch, 52], np.int64), "flat_shape"))
    else:
        nodes += [
            helper.make_node("MatMul", ["f", "w"], ["m"]),
            helper.make_node("Expand", ["bias", "bias_shape"], ["b"]),
            helper.make_node("Add", ["m", "b"], ["text_features"]),
        ]
        inits += [
            numpy_helper.from_array(np.arange(4, dtype=np.float32), "bias"),
            numpy_helper.from_array(np.array([batch, 4], np.int64), "bias_shape"),
        ]
    graph = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info("text", TensorProto.INT64, [batch, 52])],
        [helper.make_tensor_value_info("text_features", TensorProto.FLOAT, [batch, 4])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("baked", ["reshape", "expand"])
def test_batch_baked_into_the_graph(tmp_path: Path, baked: str) -> None:
    graphs = {}
    for b in (4, 8):
        onnx.save_model(_text_graph(b, baked), str(tmp_path / f"t{b}.onnx"))
        graphs[b] = f"t{b}.onnx"
    tower = TowerSpec("text", "text_features", {"fp32": graphs})
    manifest = ModelManifest("baked", "test", 4, 224, 52, 100.0, {"text": tower, "image": tower}, directory=tmp_path)
    if baked == "reshape":  # the Reshape target gets -1 for the batch and the graph checks out
        graph, bucket = dynamic_batch_graph(manifest, "text", "fp32")
        assert bucket == 8  # the largest bucket first: its batch is least likely to be a model dimension
        relaxed = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
        assert relaxed.run(None, {"text": np.ones((3, 52), np.int64)})[0].shape == (3, 4)
    else:
        with pytest.raises(ModelError, match="cannot make a batch-dynamic text graph .* --backend npu_ge"):
            dynamic_batch_graph(manifest, "text", "fp32")


def test_bad_options_are_refused(toy_model_dir: Path, repo: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="only applies to --backend npu_ge"):
        export_triton_repository(toy_model_dir, tmp_path / "a", ExportOptions(aicore="12|10"))
    with pytest.raises(InvalidInput, match="cube|vector"):
        export_triton_repository(toy_model_dir, tmp_path / "a", ExportOptions(backend="npu_ge", aicore="12"))
    with pytest.raises(InvalidInput, match=r"--max-batch 6 is not a bucket of the text graphs \[1, 4, 8, 16, 32\]"):
        export_triton_repository(toy_model_dir, tmp_path / "a", ExportOptions(backend="npu_ge", max_batch=6))
    with pytest.raises(InvalidInput, match="has no fp16 graphs"):
        export_triton_repository(toy_model_dir, tmp_path / "a", ExportOptions(precision="fp16"))
    with pytest.raises(InvalidInput, match="exists and is not empty; pass --force"):
        export_triton_repository(toy_model_dir, repo, ExportOptions())
    with pytest.raises(InvalidInput, match="--backend must be one of onnxruntime, python, npu_ge"):
        export_triton_repository(toy_model_dir, tmp_path / "a", ExportOptions(backend="tensorrt"))  # type: ignore[arg-type]
    assert not (tmp_path / "a").exists() and not list(tmp_path.glob(".a.partial"))


def test_cli_writes_a_repository(toy_model_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "repo"
    args = ["export-triton", "--model", str(toy_model_dir), "--out", str(out), "--backend", "npu_ge"]
    result = runner.invoke(build_cli(), [*args, "--instances", "2", "--aicore", "12|10", "--device-ids", "0,1"])
    assert result.exit_code == 0, result.output
    assert "cnclip_image      static batch 32  (from bucket graph b32)" in result.output
    assert parse_config(out / "cnclip_image" / "config.pbtxt").parameters["device_ids"].string_value == "0,1"
    again = runner.invoke(build_cli(), [*args, "--device-ids", "0,x"])
    assert again.exit_code == 2 and "comma-separated device numbers" in again.output
    refused = runner.invoke(build_cli(), args)
    assert refused.exit_code == 1 and "pass --force" in refused.output


def test_cnclip_architecture_graphs_become_batch_dynamic(tmp_path: Path) -> None:
    """The real CN-CLIP architecture (tiny widths) through `convert`: its static graphs bake the batch
    into Reshape targets and the folded class token; the export undoes both and checks itself."""
    import torch

    from retrieval.toolchain.convert import pipeline
    from retrieval.toolchain.convert.checkpoint import build_model
    from tests.support.cnclip_models import TINY_VIT

    torch.manual_seed(0)
    model_dir = tmp_path / "tiny-cnclip"
    pipeline.convert_model(build_model(TINY_VIT), model_dir, "tiny-vit", buckets=[1, 3], precisions=["fp32"])
    report = export_triton_repository(model_dir, tmp_path / "repo", ExportOptions())
    # One text model per length bucket (convert's default lengths 16, 32, 52), each batch-dynamic.
    assert report.source_bucket == {"cnclip_text": 3, "cnclip_text_l16": 3, "cnclip_text_l32": 3, "cnclip_image": 3}
    manifest = ModelManifest.load(model_dir)
    image_graph = onnx.load(str(tmp_path / "repo" / "cnclip_image" / "1" / "model.onnx"))
    assert "Expand" in {n.op_type for n in image_graph.graph.node}  # the class token follows the batch
    size = manifest.image_size
    pixels = np.random.default_rng(1).standard_normal((5, 3, size, size)).astype(np.float32)
    ids = tokenize(["一只猫", "穿红色裙子的女孩", "汽车", "city at night", "海边"])
    for tower, name, x in (("image", "cnclip_image", pixels), ("text", "cnclip_text", ids)):
        single = session(manifest.graph_path(tower, "fp32", 1))
        expected = np.concatenate([single.run(None, {tower: x[i : i + 1]})[0] for i in range(5)])
        exported = session(tmp_path / "repo" / name / "1" / "model.onnx")
        np.testing.assert_allclose(exported.run(None, {tower: x})[0], expected, atol=1e-4)
        np.testing.assert_allclose(exported.run(None, {tower: x[:2]})[0], expected[:2], atol=1e-4)
    short = session(tmp_path / "repo" / "cnclip_text_l16" / "1" / "model.onnx")
    config = parse_config(tmp_path / "repo" / "cnclip_text_l16" / "config.pbtxt")
    assert list(config.input[0].dims) == [16]
    full = session(manifest.graph_path("text", "fp32", 1))
    expected = np.concatenate([full.run(None, {"text": ids[i : i + 1]})[0] for i in range(5)])
    np.testing.assert_allclose(short.run(None, {"text": ids[:, :16]})[0], expected, atol=1e-4)


def test_python_backend_configs_parse_and_batch(python_repo: Path) -> None:
    """`--backend python`: the towers as Python-backend models next to the batch-dynamic graphs."""
    configs = {name: parse_config(python_repo / name / "config.pbtxt") for name in MODELS}
    for name, dims in (("cnclip_text", [52]), ("cnclip_image", [3, 224, 224])):
        config = configs[name]
        assert (config.backend, config.max_batch_size) == ("python", 16)
        assert list(config.input[0].dims) == dims and list(config.output[0].dims) == [32]
        assert config.input[0].data_type == (
            model_config_pb2.TYPE_INT64 if name == "cnclip_text" else model_config_pb2.TYPE_FP32
        )
        assert list(config.dynamic_batching.preferred_batch_size) == [4, 8, 16]
        assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
        assert {k: v.string_value for k, v in config.parameters.items()} == {
            "provider": "auto",
            "intra_op_threads": "0",
        }
        assert {"model.onnx", "model.py"} <= {p.name for p in (python_repo / name / "1").iterdir()}
    assert configs["preprocess"].max_batch_size == 16 and configs["cnclip_image_bytes"].max_batch_size == 16


def test_python_tower_model_runs_all_requests_as_one_batch(
    python_repo: Path, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pb = fake_python_backend(monkeypatch)
    module = load_by_path("exported_tower", python_repo / "cnclip_text" / "1" / "model.py")
    model = module.TritonPythonModel()
    config = json_format.MessageToDict(
        parse_config(python_repo / "cnclip_text" / "config.pbtxt"), preserving_proto_field_name=True
    )
    args = {
        "model_config": json.dumps(config),
        "model_repository": str(python_repo / "cnclip_text"),
        "model_version": "1",
        "model_name": "cnclip_text",
        "model_instance_kind": "CPU",
        "model_instance_name": "cnclip_text_0_0",
    }
    model.initialize(args)
    assert model.provider == "cpu"
    calls = []
    run = model.session.run
    model.session.run = lambda *a, **k: calls.append(a[1]["text"].shape) or run(*a, **k)
    ids = tokenize(["一只猫", "汽车", "海边的日落", "城市夜景", "书"])
    requests = [
        {"text": pb.Tensor("text", ids[:2])},
        {"text": pb.Tensor("text", ids[2:3])},
        {"text": pb.Tensor("text", ids[3:])},
    ]
    responses = model.execute(requests)
    assert calls == [(5, 52)]  # one session run for the three requests Triton's batcher handed over
    single = session(ModelManifest.load(toy_model_dir).graph_path("text", "fp32", 1))
    expected = np.concatenate([single.run(None, {"text": ids[i : i + 1]})[0] for i in range(5)])
    got = np.concatenate([r.output_tensors[0].as_numpy() for r in responses])
    assert [r.output_tensors[0].as_numpy().shape[0] for r in responses] == [2, 1, 2]
    np.testing.assert_allclose(got, expected, atol=1e-5)

    model.session.run = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("device lost"))
    failed = model.execute(requests[:2])
    assert [r.error.message for r in failed] == ["RuntimeError: device lost"] * 2


def test_python_tower_model_chooses_its_provider() -> None:
    module = load_by_path(
        "tower_providers", Path(__file__).resolve().parents[2] / "retrieval" / "toolchain" / "triton" / "onnx_model.py"
    )
    cpu_only = ["CPUExecutionProvider"]
    with_cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert module.choose_provider("auto", cpu_only, "CPU")[0] == "cpu"
    assert module.choose_provider("auto", with_cuda, "GPU")[0] == "cuda"
    assert module.choose_provider("auto", with_cuda, "CPU")[0] == "cpu"  # a CPU instance stays on the CPU
    assert module.choose_provider("cuda", with_cuda, "CPU")[0] == "cuda"
    with pytest.raises(ValueError, match="no CANNExecutionProvider"):
        module.choose_provider("cann", cpu_only, "CPU")
    with pytest.raises(ValueError, match="unknown provider"):
        module.choose_provider("tpu", cpu_only, "CPU")


def test_cli_exports_the_python_backend(toy_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    args = [
        "export-triton",
        "--model",
        str(toy_model_dir),
        "--out",
        str(out),
        "--backend",
        "python",
        "--max-batch",
        "8",
    ]
    result = CliRunner().invoke(build_cli(), args)
    assert result.exit_code == 0, result.output
    assert "cnclip_text       max_batch_size 8" in result.output
    assert parse_config(out / "cnclip_text" / "config.pbtxt").backend == "python"
    wrong = CliRunner().invoke(build_cli(), [*args[:-4], "--backend", "tensorrt"])
    assert wrong.exit_code == 2 and "--backend must be one of onnxruntime, python, npu_ge" in wrong.output
