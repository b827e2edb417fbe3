"""`cnclip models pull` against a local HTTP server on 127.0.0.1 (no real download, ever)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import build_cli
from retrieval.manifest import ModelManifest
from retrieval.toolchain.convert import pull
from retrieval.toolchain.convert.checkpoint import load_checkpoint
from tests.support.cnclip_models import TINY_VIT, official_checkpoint, reference_model

runner = CliRunner()
FILE_PATH = "/OFA-Sys/chinese-clip-vit-base-patch16/resolve/main/clip_cn_vit-b-16.pt"


@dataclass
class Hub:
    """What the fake Hugging Face serves, and what it was asked."""

    body: bytes
    corrupt: bool = False
    send_etag: bool = True
    cut_after: int | None = None  # bytes sent before the connection drops (once)
    requests: list[dict[str, str]] = field(default_factory=list)


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            hub.requests.append({"path": self.path, "range": self.headers.get("Range", "")})
            if self.path != FILE_PATH:
                self.send_error(404)
                return
            body = bytearray(hub.body)
            if hub.corrupt:
                body[len(body) // 2] ^= 0xFF
            start = 0
            if self.headers.get("Range", "").startswith("bytes="):
                start = int(self.headers["Range"][6:].split("-")[0])
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            else:
                self.send_response(200)
            if hub.send_etag:  # Hugging Face sends the LFS sha256 as the ETag
                self.send_header("ETag", f'"{hashlib.sha256(hub.body).hexdigest()}"')
            self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            if hub.cut_after is not None:
                self.wfile.write(bytes(body[start : start + hub.cut_after]))
                hub.cut_after = None
                self.close_connection = True
                return
            self.wfile.write(bytes(body[start:]))

    return Handler


@pytest.fixture(scope="module")
def checkpoint_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = official_checkpoint(reference_model(TINY_VIT), tmp_path_factory.mktemp("ckpt") / "tiny.pt")
    return path.read_bytes()


@pytest.fixture
def hub(checkpoint_bytes: bytes) -> Iterator[tuple[Hub, str]]:
    state = Hub(body=checkpoint_bytes)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _pull(base_url: str, directory: Path, *extra: str) -> tuple[int, str]:
    result = runner.invoke(
        build_cli(),
        ["models", "pull", "ViT-B-16", "--dir", str(directory), *extra],
        env={"CNCLIP_MODEL_BASE_URL": base_url},
    )
    return result.exit_code, result.output


def test_pull_downloads_verifies_and_converts(hub: tuple[Hub, str], tmp_path: Path) -> None:
    state, base = hub
    code, output = _pull(base, tmp_path)
    assert code == 0, output
    target = tmp_path / "clip_cn_vit-b-16.pt"
    assert target.read_bytes() == state.body and not (tmp_path / "clip_cn_vit-b-16.pt.part").exists()
    assert "cnclip convert --arch ViT-B-16 --checkpoint" in output
    assert state.requests == [{"path": FILE_PATH, "range": ""}]
    # The pulled file is an official-format checkpoint: it loads and converts (tiny config, one bucket).
    config, _ = load_checkpoint(target)
    assert config is None
    (tmp_path / "tiny.json").write_text(json.dumps(TINY_VIT))
    result = runner.invoke(
        build_cli(),
        ["convert", "--config", str(tmp_path / "tiny.json"), "--checkpoint", str(target)]
        + ["--out", str(tmp_path / "model"), "--buckets", "1", "--precision", "fp32"],
    )
    assert result.exit_code == 0, result.output
    assert ModelManifest.load(tmp_path / "model").towers["text"].buckets("fp32") == [1]
    # A second pull finds the file and downloads nothing.
    code, output = _pull(base, tmp_path)
    assert code == 0 and "already downloaded" in output and len(state.requests) == 1


def test_interrupted_download_resumes_with_a_range_request(hub: tuple[Hub, str], tmp_path: Path) -> None:
    state, base = hub
    half = len(state.body) // 2
    (tmp_path / "clip_cn_vit-b-16.pt.part").write_bytes(state.body[:half])
    code, output = _pull(base, tmp_path)
    assert code == 0, output
    assert state.requests == [{"path": FILE_PATH, "range": f"bytes={half}-"}]
    assert (tmp_path / "clip_cn_vit-b-16.pt").read_bytes() == state.body


def test_corrupted_download_is_deleted_with_a_checksum_error(hub: tuple[Hub, str], tmp_path: Path) -> None:
    state, base = hub
    state.corrupt = True
    code, output = _pull(base, tmp_path)
    assert code == 1
    assert "checksum mismatch" in output and "deleted" in output
    assert list(tmp_path.iterdir()) == []


def test_given_sha256_is_checked_when_the_server_states_none(hub: tuple[Hub, str], tmp_path: Path) -> None:
    state, base = hub
    state.send_etag = False
    code, output = _pull(base, tmp_path, "--sha256", "0" * 64)
    assert code == 1 and "checksum mismatch" in output
    code, output = _pull(base, tmp_path, "--sha256", hashlib.sha256(state.body).hexdigest())
    assert code == 0, output


def test_missing_file_is_a_404_message(hub: tuple[Hub, str], tmp_path: Path) -> None:
    _, base = hub
    code, output = _pull(base + "/mirror/{repo}/{file}", tmp_path)
    assert code == 1 and "not found (HTTP 404)" in output and "/mirror/chinese-clip-vit-base-patch16/" in output


def test_no_network_is_explained(tmp_path: Path) -> None:
    code, output = _pull("http://127.0.0.1:9", tmp_path)  # the discard port: nothing listens
    assert code == 1 and "cannot download from 127.0.0.1:9" in output and "no network?" in output
    # Nothing was downloaded: no partial file is promised, and none is left behind.
    assert "partial file" not in output and list(tmp_path.iterdir()) == []


def test_a_dropped_download_keeps_what_it_got_and_resumes(hub: tuple[Hub, str], tmp_path: Path) -> None:
    state, base = hub
    cut = len(state.body) - 1000
    state.cut_after = cut
    code, output = _pull(base, tmp_path)
    part = tmp_path / "clip_cn_vit-b-16.pt.part"
    kept = part.stat().st_size  # what reached the disk (whole 1 MiB blocks): the message says that much
    assert code == 1 and 0 < kept <= cut
    assert f"The partial file {part} ({kept:,} bytes) is kept" in output.replace("\n", "")
    code, output = _pull(base, tmp_path)
    assert code == 0, output
    assert state.requests[-1]["range"] == f"bytes={kept}-"
    assert (tmp_path / "clip_cn_vit-b-16.pt").read_bytes() == state.body


def test_models_list_prints_whole_urls_when_piped() -> None:
    """Not a terminal (a pipe, CliRunner): every URL on one line, uncut, and the same in --json."""
    urls = [pull.checkpoint_url(c, "https://huggingface.co") for c in pull.CHECKPOINTS.values()]
    env = {"CNCLIP_MODEL_BASE_URL": "https://huggingface.co"}
    listed = runner.invoke(build_cli(), ["models", "list"], env=env)
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert lines[0].split() == ["name", "size", "url"]
    assert [line.split()[-1] for line in lines[1:]] == urls
    as_json = runner.invoke(build_cli(), ["models", "list", "--json"], env=env)
    assert [m["url"] for m in json.loads(as_json.output)["models"]] == urls


def test_disk_full_is_detected_before_writing(
    hub: tuple[Hub, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, base = hub

    class Usage:
        free = 10

    monkeypatch.setattr(pull.shutil, "disk_usage", lambda _path: Usage())
    code, output = _pull(base, tmp_path)
    assert code == 1 and "disk full" in output
    assert not (tmp_path / "clip_cn_vit-b-16.pt").exists()


def test_unknown_model_lists_the_known_ones(tmp_path: Path) -> None:
    result = runner.invoke(build_cli(), ["models", "pull", "ViT-Z", "--dir", str(tmp_path)])
    assert result.exit_code == 1 and "ViT-B-16, ViT-L-14, ViT-L-14-336, ViT-H-14, RN50" in result.output


def test_official_urls() -> None:
    urls = {name: pull.checkpoint_url(c, "https://huggingface.co") for name, c in pull.CHECKPOINTS.items()}
    assert urls["ViT-B-16"] == (
        "https://huggingface.co/OFA-Sys/chinese-clip-vit-base-patch16/resolve/main/clip_cn_vit-b-16.pt"
    )
    assert urls["ViT-L-14-336"].endswith(
        "/OFA-Sys/chinese-clip-vit-large-patch14-336px/resolve/main/clip_cn_vit-l-14-336.pt"
    )
    assert urls["RN50"].endswith("/OFA-Sys/chinese-clip-rn50/resolve/main/clip_cn_rn50.pt")
    assert set(urls) == {"RN50", "ViT-B-16", "ViT-L-14", "ViT-L-14-336", "ViT-H-14"}
