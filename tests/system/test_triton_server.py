"""`cnclip triton-server`: the wheel's tritonserver started as a user starts it, and what it refuses.

The server tests start the command in a subprocess, each with its own lifecycle: from a venv's python
called by full path with no venv on PATH (what a service manager does), Ctrl-C, and a server that
dies under the launcher. A `probe` model added to the repository reports which Python the Python
backend's stub runs, so that "it found some numpy" cannot pass for "it runs this venv".
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton_http
from typer.testing import CliRunner

from cli.main import build_cli
from retrieval.tokenizer import tokenize
from retrieval.toolchain.triton import server as triton_server
from retrieval.toolchain.triton.export import ExportOptions, export_triton_repository
from retrieval.toolchain.triton.server import TritonLaunch, TritonServerError, repository_models
from tests.support.cli_server import CNCLIP
from tests.support.kserve_server import free_port, image_file
from tests.support.real_triton import RealTriton, unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
needs_wheel = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))

PROBE_CONFIG = """name: "probe"
backend: "python"
max_batch_size: 0
input { name: "x" data_type: TYPE_INT32 dims: [ 1 ] }
output { name: "facts" data_type: TYPE_STRING dims: [ 1 ] }
"""
PROBE_MODEL = """import json
import sys

import numpy as np
import onnxruntime
import PIL
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        facts = {"prefix": sys.prefix, "version": sys.version.split()[0], "numpy": np.__file__,
                 "PIL": PIL.__file__, "onnxruntime": onnxruntime.__file__}
        out = np.array([json.dumps(facts).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("facts", out)]) for _ in requests]
"""


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(build_cli(), list(args))
    return result.exit_code, result.output


# --- what it refuses, before anything starts -----------------------------------------------------------


def test_refuses_repositories_the_wheel_cannot_serve(toy_model_dir: Path, tmp_path: Path) -> None:
    onnx_repo, npu_repo = tmp_path / "ort", tmp_path / "npu"
    export_triton_repository(toy_model_dir, onnx_repo, ExportOptions(backend="onnxruntime", max_batch=8))
    export_triton_repository(toy_model_dir, npu_repo, ExportOptions(backend="npu_ge", max_batch=8))
    with pytest.raises(TritonServerError) as err:
        repository_models(onnx_repo, {"python"})
    assert "model 'cnclip_image' uses the onnxruntime backend" in err.value.message
    assert "--backend python" in err.value.message and "NVIDIA's Triton image" in err.value.message
    with pytest.raises(TritonServerError, match="uses the npu_ge backend.*ge-backend"):
        repository_models(npu_repo, {"python"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(TritonServerError, match="holds no models"):
        repository_models(tmp_path / "empty", {"python"})
    with pytest.raises(TritonServerError, match="is not a directory"):
        repository_models(tmp_path / "nowhere", {"python"})


def test_a_platform_name_counts_as_its_backend(python_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(python_repo, repo)
    assert repository_models(repo, {"python"}) == ["cnclip_image", "cnclip_image_bytes", "cnclip_text", "preprocess"]
    (repo / "other").mkdir()
    (repo / "other" / "config.pbtxt").write_text('name: "other"\nplatform: "onnxruntime_onnx"\n')
    with pytest.raises(TritonServerError, match="'other' uses the onnxruntime backend"):
        repository_models(repo, {"python"})


@needs_wheel
def test_cli_errors_are_one_line(toy_model_dir: Path, python_repo: Path, tmp_path: Path) -> None:
    onnx_repo = tmp_path / "ort"
    export_triton_repository(toy_model_dir, onnx_repo, ExportOptions(backend="onnxruntime", max_batch=8))
    code, output = run_cli("triton-server", str(onnx_repo))
    assert code == 1 and output.startswith("error: model 'cnclip_image' uses the onnxruntime backend")
    assert output.count("\n") == 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output = run_cli("triton-server", str(python_repo), "--http-port", str(port), "--grpc-port", "0")
    assert code == 1 and output == f"error: HTTP port {port} on 127.0.0.1 is in use\n"
    code, output = run_cli("triton-server", str(python_repo), "--http-port", "9000", "--grpc-port", "9000")
    assert code == 1 and "ports must differ" in output
    for flag, value in (("--http-port", "0"), ("--grpc-port", "70000"), ("--metrics-port", "-1")):
        code, output = run_cli("triton-server", str(python_repo), flag, value)
        assert code == 2 and f"{flag} must be" in output, output
    code, output = run_cli("triton-server", str(python_repo), "--http-prot", "9000")  # a typo is not for tritonserver
    assert code == 2 and "No such option: --http-prot" in output


@needs_wheel
def test_a_package_the_models_import_and_this_python_lacks_is_named(
    python_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert triton_server.missing_imports(python_repo) == []  # numpy, Pillow, onnxruntime: all here
    repo = tmp_path / "repo"
    shutil.copytree(python_repo, repo)
    real_find_spec = triton_server.importlib.util.find_spec
    monkeypatch.setattr(
        triton_server.importlib.util, "find_spec", lambda name: None if name == "PIL" else real_find_spec(name)
    )
    assert triton_server.missing_imports(repo) == [("preprocess", "PIL")]
    code, output = run_cli("triton-server", str(repo), "--grpc-port", "0")
    assert code == 1 and output == (
        f"error: model 'preprocess' imports PIL, which this Python does not have: "
        f"`{sys.executable} -m pip install pillow`\n"
    )


def test_without_the_wheel_it_says_what_to_install(python_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_server, "unavailable_reason", lambda: None)  # any platform: the wheel is missing
    monkeypatch.setitem(sys.modules, "pytriton", None)  # `import pytriton` raises ImportError
    code, output = run_cli("triton-server", str(python_repo))
    assert code == 1
    assert output == (
        "error: no tritonserver: it comes with the nvidia-pytriton wheel, `pip install nvidia-pytriton==0.7.0` "
        "(x86_64/aarch64 Linux with glibc >= 2.35)\n"
    )


def test_off_its_platforms_it_says_which(python_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_server.platform, "machine", lambda: "riscv64")
    code, output = run_cli("triton-server", str(python_repo))
    assert code == 1 and output.startswith("error: nvidia-pytriton's tritonserver runs on x86_64/aarch64 Linux")


def test_interpreter_bin_is_a_venvs_bin_or_a_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    shutil.copy(sys.executable, venv_bin / "python3")  # `venv --copies`: no link back to the base interpreter
    monkeypatch.setattr(triton_server.sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(triton_server.sys, "base_prefix", "/somewhere/else")
    assert triton_server.interpreter_bin(tmp_path / "work") == venv_bin  # pyvenv.cfg is found beside it
    # Not a venv, and the interpreter's own folder has another `python3`: a link to this one goes first.
    other = tmp_path / "other"
    other.mkdir()
    (other / "python3.11").symlink_to(sys.executable)
    (other / "python3").symlink_to("/bin/sh")
    monkeypatch.setattr(triton_server.sys, "base_prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(triton_server.sys, "executable", str(other / "python3.11"))
    (tmp_path / "work").mkdir()
    folder = triton_server.interpreter_bin(tmp_path / "work")
    assert folder == tmp_path / "work" / "bin" and (folder / "python3").resolve() == Path(sys.executable).resolve()


def test_launch_urls_reach_a_wildcard_on_loopback() -> None:
    assert TritonLaunch(Path("r"), host="0.0.0.0", http_port=8000).http_url == "http://127.0.0.1:8000"
    assert TritonLaunch(Path("r"), host="::", http_port=8000).http_url == "http://[::1]:8000"
    assert TritonLaunch(Path("r"), host="10.0.0.5", http_port=9).http_url == "http://10.0.0.5:9"


def test_export_triton_prints_the_command_that_serves_it(toy_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    code, output = run_cli("export-triton", "--model", str(toy_model_dir), "--out", str(out), "--backend", "python")
    assert code == 0 and f"serve it with: cnclip triton-server {out}\n" in output
    code, output = run_cli("export-triton", "--model", str(toy_model_dir), "--out", str(tmp_path / "ort"))
    assert (
        code == 0 and "NVIDIA's Triton image (nvcr.io/nvidia/tritonserver): tritonserver --model-repository" in output
    )
    assert "cnclip triton-server serves only --backend python" in output.replace("`", "")


# --- the server, started as users start it -----------------------------------------------------------


@pytest.fixture
def probe_repo(python_repo: Path, tmp_path: Path) -> Path:
    """The python export plus `probe`, a model that says which Python runs it."""
    repo = tmp_path / "repo"
    shutil.copytree(python_repo, repo)
    (repo / "probe" / "1").mkdir(parents=True)
    (repo / "probe" / "config.pbtxt").write_text(PROBE_CONFIG)
    (repo / "probe" / "1" / "model.py").write_text(PROBE_MODEL)
    return repo


def probe(url: str) -> dict[str, str]:
    client = triton_http.InferenceServerClient(url)
    try:
        x = triton_http.InferInput("x", [1], "INT32")
        x.set_data_from_numpy(np.zeros(1, dtype=np.int32))
        facts = client.infer("probe", [x]).as_numpy("facts")
        assert facts is not None
        return dict(json.loads(facts[0]))
    finally:
        client.close()


def wait_for_line(log: Path, text: str, process: subprocess.Popen[bytes], timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        output = log.read_text(encoding="utf-8", errors="replace")
        if text in output:
            return output
        if process.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} in the output:\n{log.read_text(errors='replace')[-3000:]}")


def inherit_site_packages(venv: Path) -> None:
    """Give a fresh venv the packages of the interpreter running the suite, whether that is a bare
    Python or itself a venv: a `.pth` file that adds each of its site directories (their own `.pth`
    files included, as the editable install's). `--system-site-packages` would not do: from a venv,
    it reaches the *base* interpreter's packages (on a fresh machine, Debian's Python: no typer)."""
    site_dirs = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    (target,) = (venv / "lib").glob("python3*/site-packages")
    lines = [f"import site; site.addsitedir({d!r})\n" for d in site_dirs]
    (target / "zz-suite-interpreter.pth").write_text("".join(lines), encoding="utf-8")


@needs_wheel
def test_a_venv_python_by_full_path_serves_with_the_venvs_packages(probe_repo: Path, tmp_path: Path) -> None:
    """As a service manager starts it: the venv's python by full path, PATH without any venv or this
    interpreter (its `python3`, when there is one, has no numpy), no VIRTUAL_ENV. The stub's Python
    must be the venv's (its prefix), and every exported model must serve."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    inherit_site_packages(venv)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmpdir), "LANG": "C.UTF-8"}
    port = free_port()
    log = tmp_path / "out.log"
    command = [str(venv / "bin" / "python"), *CNCLIP[1:], "triton-server", str(probe_repo), "--http-port", str(port)]
    with log.open("ab") as out:  # cwd: this checkout, so that `-c` imports the code under test
        process = subprocess.Popen(
            [*command, "--grpc-port", str(free_port())], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        output = wait_for_line(log, "embed through it:", process, timeout_s=90)
        assert f"ready: HTTP http://127.0.0.1:{port} (KServe v2, /v2/health/ready)" in output
        assert f"Python backend on {venv / 'bin' / 'python'}" in output
        assert list(tmpdir.glob("cnclip-triton-*/backends/python/triton_python_backend_stub"))
        facts = probe(f"127.0.0.1:{port}")
        assert facts["prefix"] == str(venv), facts  # the venv's Python, not /usr/bin/python3's nor the base's
        assert facts["version"] == ".".join(map(str, sys.version_info[:3]))
        # Every model of the export serves: numpy, Pillow (preprocess) and onnxruntime (the towers).
        client = triton_http.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            text = triton_http.InferInput("text", [1, 52], "INT64")
            text.set_data_from_numpy(tokenize(["一只猫"]))
            assert client.infer("cnclip_text", [text]).as_numpy("text_features").shape == (1, 32)  # type: ignore[union-attr]
            files = triton_http.InferInput("image_bytes", [1, 1], "BYTES")
            files.set_data_from_numpy(np.array([[image_file((10, 200, 10), fmt="JPEG")]], dtype=np.object_))
            assert client.infer("cnclip_image_bytes", [files]).as_numpy("image_features").shape == (1, 32)  # type: ignore[union-attr]
        finally:
            client.close()
        process.send_signal(signal.SIGTERM)  # a service manager's stop: a clean exit is 0
        assert process.wait(timeout=40) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not list(tmpdir.iterdir()), "the temporary backend folder was left behind"


@needs_wheel
def test_ctrl_c_stops_the_server_and_its_stubs(python_repo: Path, tmp_path: Path) -> None:
    with RealTriton(python_repo, log_path=tmp_path / "out.log") as triton:
        assert triton.process is not None
        server, stubs = triton.server_pid(), triton.children()
        assert server is not None and len(stubs) >= 4  # a stub per model instance
        triton.process.send_signal(signal.SIGINT)
        assert triton.process.wait(timeout=40) == 130  # the project's status for Ctrl-C
    for pid in (server, *stubs):
        assert not Path(f"/proc/{pid}").exists(), f"process {pid} outlived cnclip triton-server"


@needs_wheel
def test_a_server_that_dies_is_an_error(python_repo: Path, tmp_path: Path) -> None:
    with RealTriton(python_repo, log_path=tmp_path / "out.log") as triton:
        assert triton.process is not None
        triton.kill()  # SIGKILL tritonserver and its stubs under the launcher
        assert triton.process.returncode == 1
        assert "error: tritonserver exited with status -9" in triton.log_tail(5)
