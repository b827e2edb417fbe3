"""A running server and encoder against hostile values (issue 28, item 3; beside
tests/system/test_hostile_settings.py, which stops `cnclip serve` at start-up): the thread bound
measured on a running encoder, a failed migration that leaves no shadow behind, a non-ASCII API key
over real HTTP, a FIFO where the model's tuning file should be, and a start-up that fails after the
port is bound."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import SecretStr

from api.app import create_app
from api.config import Settings
from indexer.service.collections import CollectionService
from indexer.service.migration import MigrateOptions
from retrieval.errors import ModelError
from retrieval.fake import FakeEncoder
from retrieval.machine_limits import inference_threads_refusal
from retrieval.manifest import ModelManifest
from retrieval.tuning import TUNING_NAME, machine_fingerprint, read_tuning
from tests.support.api_helpers import open_test_catalog
from tests.support.cli_server import CNCLIP
from tests.support.hostile_models import CORES, RUN_TIMEOUT_S, base_env, spoiled, toy_model
from tests.support.indexer_helpers import jpeg
from tests.support.live_server import LiveServer


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return toy_model(tmp_path_factory)


# --- threads: bounded by the cores, in the settings and in the tuning file -------------------------------
def _threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_a_tuning_file_asking_4096_threads_starts_no_more_than_the_cores(toy: Path, tmp_path: Path) -> None:
    from retrieval.encoder import LocalEncoder

    model = spoiled(toy, tmp_path, lambda d: None)
    choice = {"backend": "onnxruntime", "device": "cpu", "precision": "fp32", "shapes": {}}
    tuning = {
        "format": 1,
        "model_id": ModelManifest.load(model).model_id,
        "created": "2026-12-04T00:00:00Z",
        "fingerprint": machine_fingerprint(),
        "towers": {t: {**choice, "streams": 1, "threads_per_stream": 4096} for t in ("image", "text")},
    }
    (model / TUNING_NAME).write_text(json.dumps(tuning))
    outcome = read_tuning(model / TUNING_NAME, tuning["model_id"], model)
    assert outcome.tuning is None and f"may run on {CORES} cores" in outcome.line
    tuning["towers"]["text"] = {**choice, "streams": 64, "threads_per_stream": 0}  # the schema's most streams
    (model / TUNING_NAME).write_text(
        json.dumps({**tuning, "towers": {**tuning["towers"], "image": tuning["towers"]["text"]}})
    )
    assert "64 streams" in read_tuning(model / TUNING_NAME, tuning["model_id"], model).line

    (model / TUNING_NAME).write_text(json.dumps(tuning))  # 4096 threads asked again: the encoder runs its defaults
    settings = Settings(_env_file=None, model_dir=model, data_dir=tmp_path / "d", provider="cpu", buckets=[1])

    async def started_threads() -> int:
        before = _threads()
        encoder = LocalEncoder(settings)
        await encoder.start()
        try:
            await encoder.embed_texts(["一只猫"])
            return _threads() - before
        finally:
            await encoder.close()

    grown = asyncio.run(started_threads())
    # Two towers × one stream × at most the cores, plus the batchers' and the preprocess pool's threads.
    assert grown <= 2 * CORES + CORES + 8, grown


def test_the_thread_rule() -> None:
    assert inference_threads_refusal(1, 0, cores=2) is None
    assert inference_threads_refusal(2, 1, cores=2) is None
    assert "3 streams" in (inference_threads_refusal(3, 0, cores=2) or "")
    assert "4096" in (inference_threads_refusal(1, 4096, cores=64) or "")
    assert inference_threads_refusal(2, 2, cores=2) is not None  # 4 threads on 2 cores


# --- a migration that fails before its first vector leaves nothing behind ----------------------------------
class LyingModel(FakeEncoder):
    """A manifest saying `dim` while its graphs give `real` dimensions."""

    def __init__(self, dim: int, real: int, model_id: str) -> None:
        super().__init__(dim=dim, model_id=model_id)
        self.real = real

    def embed_images_sync(self, images: Any) -> np.ndarray:
        vectors = np.random.default_rng(0).normal(size=(len(images), self.real)).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_a_migration_refused_before_its_first_vector_removes_its_shadow(tmp_path: Path) -> None:
    from tests.support.indexer_helpers import open_test_catalog as open_catalog_at

    async def scenario() -> None:
        catalog = open_catalog_at(tmp_path / "data", f"sqlite:///{tmp_path / 'c.db'}")
        try:
            old = FakeEncoder()
            await old.start()
            service = CollectionService(catalog, old)
            service.create("photos", "images")
            from retrieval.preprocess import read_header

            for n in range(3):
                await service.writes.add_upload("photos", jpeg(n), read_header(jpeg(n)))
            liar = LyingModel(dim=64, real=128, model_id="liar")
            await liar.start()
            with pytest.raises(Exception):  # noqa: B017 - whatever the store says of 128-d vectors in a 64-d shadow
                await service.migration.migrate("photos", liar, MigrateOptions(batch=2))
            assert service.migration.status("photos").shadow is None
            honest = FakeEncoder(dim=16, model_id="honest")
            await honest.start()
            report = await service.migration.migrate(
                "photos", honest, MigrateOptions(batch=2)
            )  # not "migrating … already"
            assert report.swapped and report.embedded == 3
        finally:
            catalog.close()

    asyncio.run(scenario())


# --- the API key is UTF-8, compared as bytes over real HTTP --------------------------------------------------
def test_a_non_ascii_api_key_matches_its_utf8_bytes_over_http(tmp_path: Path, toy: Path) -> None:
    key = "clé-密钥"
    settings = Settings(_env_file=None, data_dir=tmp_path / "d", provider="cpu", api_key=SecretStr(key))
    catalog = open_test_catalog(settings)
    try:
        app = create_app(settings, encoder=FakeEncoder(), catalog=catalog)
        with LiveServer(app) as live, httpx.Client(base_url=live.base_url, timeout=10) as client:

            def create(headers: dict[str, bytes], name: str) -> int:
                return client.post(
                    "/v1/collections", json={"name": name, "kind": "images"}, headers=headers
                ).status_code

            assert create({"X-API-Key": key.encode("utf-8")}, "a") == 201
            assert create({"Authorization": b"Bearer " + key.encode("utf-8")}, "b") == 201
            assert create({"X-API-Key": "clé".encode("latin-1")}, "c") == 401  # the latin-1 bytes are not the key
            assert create({"X-API-Key": key.encode("utf-8")[:-1]}, "d") == 401
            assert create({"X-API-Key": b"cl\xc3"}, "e") == 401
    finally:
        catalog.close()


def test_serve_with_a_fifo_as_the_models_tuning_file_starts_on_the_defaults(tmp_path: Path, toy: Path) -> None:
    """The issue's `mkfifo MODEL/tuning.json`: `cnclip serve` hung before its first line. The file is
    the model directory's, not a setting: refused in one line, and the server runs the defaults."""
    model = spoiled(toy, tmp_path, lambda d: os.mkfifo(d / TUNING_NAME))
    env = base_env(tmp_path, model)
    process = subprocess.Popen(
        [*CNCLIP, "serve", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    lines: list[str] = []
    try:
        reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
        reader.start()
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not any("Uvicorn running" in line for line in lines):
            assert process.poll() is None, "".join(lines)[-3000:]
            assert time.monotonic() < deadline, "cnclip serve did not start: " + "".join(lines)[-3000:]
            time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=30)
    refused = [line for line in lines if "tuning file" in line and "refused" in line]
    assert len(refused) == 1 and "a FIFO, not a regular file" in refused[0], "".join(lines)[-3000:]
    assert not any("Traceback" in line for line in lines)


# --- a start-up that fails after the port is bound: one line for a project error, a traceback for a bug ----
@pytest.mark.parametrize(("raised", "one_line"), [(ModelError("the graph cannot load"), True), (KeyError("x"), False)])
def test_a_project_error_at_start_up_is_one_line_not_a_traceback(raised: BaseException, one_line: bool) -> None:
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette

    from cli.serving import OneLineStartupFailure

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        raise raised
        yield  # pragma: no cover

    app = OneLineStartupFailure(Starlette(lifespan=lifespan))
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "lifespan.startup"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def main() -> None:
        with pytest.raises(type(raised)):
            await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)

    asyncio.run(main())
    failed = [m for m in sent if m["type"] == "lifespan.startup.failed"]
    assert len(failed) == 1
    if one_line:
        assert failed[0]["message"] == "error: the graph cannot load"
    else:
        assert "Traceback" in failed[0]["message"] and "KeyError" in failed[0]["message"]
