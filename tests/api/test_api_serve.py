"""`cnclip serve` / `cnclip worker`: options reach uvicorn, the port is bound before the model
loads, a bad model directory or a busy port fails in one line."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from typer.testing import CliRunner

from cli.main import build_cli


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # what uvicorn sets: still refused
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield int(other.getsockname()[1])


def test_serve_passes_host_and_port_to_uvicorn(
    monkeypatch: pytest.MonkeyPatch, toy_model_dir: Path, tmp_path: Path
) -> None:
    import faiss
    import uvicorn

    seen: dict[str, Any] = {}
    threads: list[int] = []
    port = free_port("127.0.0.2")

    def run(server: uvicorn.Server, sockets: list[socket.socket]) -> None:
        seen.update(config=server.config, bound=[s.getsockname() for s in sockets])

    monkeypatch.setattr(faiss, "omp_set_num_threads", threads.append)  # keep this process's FAISS as it was
    monkeypatch.setattr(uvicorn.Server, "run", run)
    monkeypatch.setenv("CNCLIP_MODEL_DIR", str(toy_model_dir))
    monkeypatch.setenv("CNCLIP_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CNCLIP_PORT", str(port))
    result = CliRunner().invoke(build_cli(), ["serve", "--host", "127.0.0.2"])
    assert result.exit_code == 0, result.output
    assert seen["bound"] == [("127.0.0.2", port)]  # flag overrides, env fills the rest; bound before serving
    assert seen["config"].app.state.settings.model_dir == toy_model_dir
    assert seen["config"].timeout_keep_alive > 5
    assert threads == [1]
    # The start-up lines (the encoder's provider/precision/buckets) are logged at INFO, as before -v existed.
    assert logging.getLogger("retrieval").level == logging.INFO
    assert CliRunner().invoke(build_cli(), ["-vv", "serve", "--host", "127.0.0.2"]).exit_code == 0
    assert logging.getLogger("retrieval").level == logging.DEBUG  # -v turns it up


def test_serve_without_a_model_fails_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CNCLIP_MODEL_DIR", str(tmp_path / "nothing-here"))
    monkeypatch.setenv("CNCLIP_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(build_cli(), ["serve"])
    assert result.exit_code == 2
    assert "no manifest.json" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("command", "factory"), [("serve", "api.app.create_app"), ("worker", "api.worker.create_worker_app")]
)
def test_busy_port_fails_in_one_line_before_the_model_loads(
    command: str, factory: str, busy_port: int, monkeypatch: pytest.MonkeyPatch, toy_model_dir: Path, tmp_path: Path
) -> None:
    """Exit 1 (an error), not uvicorn's 3 after the warm-up; the app (which loads the model) is never built."""
    built: list[object] = []
    monkeypatch.setattr(factory, lambda *args, **kwargs: built.append(args))
    monkeypatch.setenv("CNCLIP_MODEL_DIR", str(toy_model_dir))
    monkeypatch.setenv("CNCLIP_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(build_cli(), [command, "--port", str(busy_port)])
    assert result.exit_code == 1, result.output
    assert result.output == f"error: cannot listen on 127.0.0.1:{busy_port}: Address already in use\n"
    assert built == []


def test_an_app_that_cannot_start_exits_1_not_3(
    monkeypatch: pytest.MonkeyPatch, toy_model_dir: Path, tmp_path: Path
) -> None:
    """uvicorn exits 3 when the app's start-up fails (e.g. an unreachable Triton); the exit status list
    (docs/indexing.md) keeps 3 for `cnclip index`, so serve says 1, an error, like every other failure."""

    @asynccontextmanager
    async def failing(_app: FastAPI) -> AsyncIterator[None]:
        raise RuntimeError("the encoder cannot start")
        yield

    monkeypatch.setattr("api.app.create_app", lambda settings: FastAPI(lifespan=failing))
    monkeypatch.setenv("CNCLIP_MODEL_DIR", str(toy_model_dir))
    monkeypatch.setenv("CNCLIP_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(build_cli(), ["serve", "--port", str(free_port())])
    assert result.exit_code == 1, result.output


@pytest.mark.parametrize("command", ["serve", "worker"])
@pytest.mark.parametrize("key", ["", "  "])
def test_an_empty_api_key_is_refused_at_start_in_one_line(
    monkeypatch: pytest.MonkeyPatch, toy_model_dir: Path, tmp_path: Path, command: str, key: str
) -> None:
    """`CNCLIP_API_KEY=` is not silently "no key" (nor a key an empty header matches): exit 2, one line."""
    started: list[Any] = []
    monkeypatch.setattr("cli.serving.run_server", lambda app, *args, **kwargs: started.append(app))
    monkeypatch.setenv("CNCLIP_MODEL_DIR", str(toy_model_dir))
    monkeypatch.setenv("CNCLIP_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CNCLIP_API_KEY", key)
    result = CliRunner().invoke(build_cli(), [command])
    assert result.exit_code == 2 and not started
    assert result.output.strip() == "error: CNCLIP_API_KEY: set but empty; set a key, or unset it to serve without one"
