"""`cnclip serve`: options reach uvicorn, a bad model directory fails in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from api.cli import build_cli


def test_serve_passes_host_and_port_to_uvicorn(
    monkeypatch: pytest.MonkeyPatch, toy_model_dir: Path, tmp_path: Path
) -> None:
    import faiss
    import uvicorn

    seen: dict[str, Any] = {}
    threads: list[int] = []
    monkeypatch.setattr(faiss, "omp_set_num_threads", threads.append)  # keep this process's FAISS as it was
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(app=app, **kwargs))
    monkeypatch.setenv("CNCLIP_MODEL_DIR", str(toy_model_dir))
    monkeypatch.setenv("CNCLIP_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CNCLIP_PORT", "9123")
    result = CliRunner().invoke(build_cli(), ["serve", "--host", "127.0.0.2"])
    assert result.exit_code == 0, result.output
    assert seen["host"] == "127.0.0.2" and seen["port"] == 9123  # flag overrides, env fills the rest
    assert seen["app"].state.settings.model_dir == toy_model_dir
    assert seen["timeout_keep_alive"] > 5
    assert threads == [1]


def test_serve_without_a_model_fails_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CNCLIP_MODEL_DIR", str(tmp_path / "nothing-here"))
    monkeypatch.setenv("CNCLIP_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(build_cli(), ["serve"])
    assert result.exit_code == 2
    assert "no manifest.json" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", ["serve", "worker"])
@pytest.mark.parametrize("key", ["", "  "])
def test_an_empty_api_key_is_refused_at_start_in_one_line(
    monkeypatch: pytest.MonkeyPatch, toy_model_dir: Path, tmp_path: Path, command: str, key: str
) -> None:
    """`CNCLIP_API_KEY=` is not silently "no key" (nor a key an empty header matches): exit 2, one line."""
    import uvicorn

    started: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: started.append(app))
    monkeypatch.setenv("CNCLIP_MODEL_DIR", str(toy_model_dir))
    monkeypatch.setenv("CNCLIP_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CNCLIP_API_KEY", key)
    result = CliRunner().invoke(build_cli(), [command])
    assert result.exit_code == 2 and not started
    assert result.output.strip() == "error: CNCLIP_API_KEY: set but empty; set a key, or unset it to serve without one"
