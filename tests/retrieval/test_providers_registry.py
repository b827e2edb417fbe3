"""The registries behind the runtime: ONNX Runtime's execution providers (retrieval/backends/ort_providers.py),
what runtime backends know of their devices, the Triton export backends, and the copy of the provider
registry that travels beside an exported Triton Python model (no NPU or GPU here: detection is faked)."""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from api.kserve_config import _instance_group
from api.kserve_tensors import ServedModel
from retrieval.backends import BACKENDS, DeviceChoice, SessionConfig, backend_named
from retrieval.backends import ort_providers as registry
from retrieval.backends.onnxruntime import ONNXRUNTIME, choose_provider, ort_providers, weight_sharing
from retrieval.errors import InvalidInput, ModelError
from retrieval.toolchain.triton.backends import ORT_PROVIDERS_SOURCE, TRITON_BACKENDS, triton_backend
from retrieval.toolchain.triton.export import ExportOptions, export_triton_repository
from tests.support.triton_configs import load_by_path

EVERY_BUILD = lambda: [p.ort_name for p in registry.PROVIDERS.values()]  # noqa: E731


def test_unknown_provider_is_a_clear_error_listing_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"^unknown provider 'tpu'; known: cann, cuda, cpu$"):
        registry.provider_named("tpu")
    with pytest.raises(ModelError, match=r"unknown provider 'tpu'; use auto, cann, cuda or cpu$"):
        choose_provider("tpu", EVERY_BUILD)
    with pytest.raises(ModelError, match="known: cann, cuda, cpu"):
        ort_providers(SessionConfig(provider="tpu", precision="fp32"))
    with pytest.raises(ModelError, match="known: cann, cuda, cpu"):
        weight_sharing("tpu", True)
    assert registry.setting_choices() == "auto, cann, cuda or cpu"


def test_each_record_builds_its_options_and_provider_list() -> None:
    cann, cuda, cpu = (registry.provider_named(n) for n in ("cann", "cuda", "cpu"))
    assert cann.options(3) == {"device_id": "3", "enable_cann_graph": "1", "precision_mode": "must_keep_origin_dtype"}
    assert cuda.options(1) == {"device_id": "1"}
    assert cpu.options(5) == {}
    assert cann.session_providers(3) == [("CANNExecutionProvider", cann.options(3)), "CPUExecutionProvider"]
    assert cuda.session_providers(1) == [("CUDAExecutionProvider", {"device_id": "1"}), "CPUExecutionProvider"]
    assert cpu.session_providers(7) == ["CPUExecutionProvider"]
    # A session configuration's providers are its record's: the same lists.
    assert ort_providers(SessionConfig(provider="cuda", precision="fp16", device_id=1)) == cuda.session_providers(1)


def test_records_say_what_callers_used_to_branch_on() -> None:
    assert list(registry.PROVIDERS) == ["cann", "cuda", "cpu"]  # auto's order of preference
    assert registry.HOST.name == "cpu" and [p.name for p in registry.accelerators()] == ["cann", "cuda"]
    assert {p.name: p.triton_kind for p in registry.PROVIDERS.values()} == {
        "cann": "KIND_MODEL",  # Triton has no NPU kind
        "cuda": "KIND_GPU",
        "cpu": "KIND_CPU",
    }
    assert {p.name: p.precisions[0] for p in registry.PROVIDERS.values()} == {
        "cann": "fp16",
        "cuda": "fp16",
        "cpu": "int8",
    }
    assert weight_sharing("cpu", True)[0] and not weight_sharing("cuda", True)[0]
    assert registry.HOST.detect().found


def test_a_new_provider_is_one_record() -> None:
    """A record built like the registry's: its options first, the host CPU as fallback."""
    npu = registry.OrtProvider(
        "xpu", "XPUExecutionProvider", lambda: registry.Detection(True, "an xpu"), lambda d: {"card": str(d)},
        on_host=False, precisions=("fp16",), triton_kind=registry.KIND_MODEL, hardware="an XPU",
    )  # fmt: skip
    assert npu.session_providers(2) == [("XPUExecutionProvider", {"card": "2"}), "CPUExecutionProvider"]


def test_auto_takes_each_accelerator_by_its_own_detection() -> None:
    yes, no = (lambda: registry.Detection(True, "here")), (lambda: registry.Detection(False, "absent"))
    assert choose_provider("auto", EVERY_BUILD, cann=no, cuda=yes) == DeviceChoice("cuda", "auto: here")
    assert choose_provider("auto", EVERY_BUILD, cann=no, cuda=no) == DeviceChoice("cpu", "auto: absent; absent")


def test_backends_know_their_devices_and_triton_kinds() -> None:
    assert ONNXRUNTIME.devices == ("cann", "cuda", "cpu") and ONNXRUNTIME.host_device == "cpu"
    assert [ONNXRUNTIME.triton_kind(d) for d in ONNXRUNTIME.devices] == ["KIND_MODEL", "KIND_GPU", "KIND_CPU"]
    openvino = backend_named("openvino")
    assert openvino.devices == ("CPU", "GPU", "NPU") and openvino.host_device == "CPU"
    # OpenVINO's GPU is not Triton's (CUDA) KIND_GPU.
    assert [openvino.triton_kind(d) for d in ("CPU", "GPU.1", "NPU")] == ["KIND_CPU", "KIND_MODEL", "KIND_MODEL"]
    for backend in BACKENDS:
        assert backend.host_device in backend.devices and backend.uses_cpu_cores(backend.host_device)


def test_served_model_config_takes_the_kind_from_the_towers_backend() -> None:
    model = ServedModel("cnclip_image", "image", "FP32", "image_features", "image")
    settings = SimpleNamespace(device_id=2, streams=3)
    plan = SimpleNamespace(backend=ONNXRUNTIME, device=DeviceChoice("cuda", "test"))
    group = _instance_group(model, SimpleNamespace(plans={"image": plan}), settings)
    assert (group["kind"], group["gpus"], group["count"]) == ("KIND_GPU", [2], 3)
    plan = SimpleNamespace(backend=ONNXRUNTIME, device=DeviceChoice("cpu", "test"))
    assert _instance_group(model, SimpleNamespace(plans={"image": plan}), settings)["kind"] == "KIND_CPU"
    remote = _instance_group(model, SimpleNamespace(), settings)  # a remote encoder has no plans
    assert (remote["kind"], remote["gpus"]) == ("KIND_MODEL", [])


def test_the_provider_registry_needs_only_the_standard_library() -> None:
    tree = ast.parse(ORT_PROVIDERS_SOURCE.read_text(encoding="utf-8"))
    modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert modules and modules <= set(sys.stdlib_module_names) | {"__future__"}, modules
    assert Path(registry.__file__) == ORT_PROVIDERS_SOURCE


def test_the_exported_python_model_carries_the_registry_and_loads_that_copy(python_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "elsewhere"  # away from the source tree, as on a Triton host
    shutil.copytree(python_repo, repo)
    for tower in ("cnclip_text", "cnclip_image"):
        copy = repo / tower / "1" / "ort_providers.py"
        assert copy.read_bytes() == ORT_PROVIDERS_SOURCE.read_bytes()
    module = load_by_path("exported_tower_registry", repo / "cnclip_text" / "1" / "model.py")
    assert Path(module.providers.__file__) == repo / "cnclip_text" / "1" / "ort_providers.py"
    assert module.choose_provider("auto", ["CPUExecutionProvider"], "CPU") == ("cpu", "auto: no NPU or GPU instance")
    (repo / "cnclip_image" / "1" / "ort_providers.py").unlink()
    with pytest.raises(ImportError, match="ort_providers.py is neither beside"):
        load_by_path("exported_tower_without_registry", repo / "cnclip_image" / "1" / "model.py")


def test_the_python_model_detects_a_provider_triton_has_no_kind_for(monkeypatch: pytest.MonkeyPatch) -> None:
    source = Path(__file__).resolve().parents[2] / "retrieval" / "toolchain" / "triton" / "onnx_model.py"
    module = load_by_path("tower_registry_detect", source)
    cann = module.providers.PROVIDERS["cann"]
    monkeypatch.setitem(
        module.providers.PROVIDERS,
        "cann",
        type(cann)(**{**cann.__dict__, "detect": lambda: registry.Detection(True, "npu")}),
    )
    every = EVERY_BUILD()
    assert module.choose_provider("auto", every, "CPU") == ("cann", "auto: npu")
    assert module.choose_provider("auto", ["CUDAExecutionProvider", "CPUExecutionProvider"], "GPU")[0] == "cuda"


def test_triton_export_backends_are_records() -> None:
    assert list(TRITON_BACKENDS) == ["onnxruntime", "python", "npu_ge"]
    assert [r.name for r in TRITON_BACKENDS.values() if not r.dynamic_batching] == ["npu_ge"]
    assert [r.name for r in TRITON_BACKENDS.values() if r.missing_hint is None] == ["python"]
    assert triton_backend("python").model_files["ort_providers.py"] == ORT_PROVIDERS_SOURCE
    with pytest.raises(ValueError, match="--backend must be one of onnxruntime, python, npu_ge, got 'tensorrt'"):
        triton_backend("tensorrt")


def test_export_refuses_an_unknown_backend_in_one_line(toy_model_dir: Path, tmp_path: Path) -> None:
    options = ExportOptions(backend="tensorrt")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="^--backend must be one of onnxruntime, python, npu_ge, got 'tensorrt'$"):
        export_triton_repository(toy_model_dir, tmp_path / "repo", options)
    assert not (tmp_path / "repo").exists()
