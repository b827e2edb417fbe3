"""Upload copies on a full disk (507, nothing left behind), FAISS files on a full disk (the committed
write still succeeds), and the start-up sweep of the media folder (orphans of a killed process
removed; nothing another process is writing ever touched)."""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from api import create_app
from api.config import Settings
from indexer.storage.media.store import media_file, media_root, media_writes, store_media
from indexer.storage.media.sweep import ORPHAN_GRACE_S, sweep_media
from retrieval.fake import FakeEncoder
from tests.support.api_helpers import api_client, image_bytes

OLD = time.time() - ORPHAN_GRACE_S - 60  # an mtime past the sweep's grace period


def noise_png(side: int, seed: int = 0) -> bytes:
    """A PNG that does not compress: side² × 3 bytes, about."""
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def upload(client: Any, data: bytes) -> httpx.Response:
    return client.post("/v1/collections/photos/items", files={"file": ("x.png", data, "image/png")})


def assert_nothing_stored(client: Any, media: Path) -> None:
    assert not [p for p in media.rglob("*") if p.is_file() and p.name != ".lock"]  # no copy, no .tmp-PID
    assert client.get("/v1/collections/photos").json()["items"] == 0


@pytest.fixture
def tmpfs_media(settings: Settings) -> Iterator[Path]:
    """The media folder on a 1 MiB tmpfs (needs root, as in the dev container and CI)."""
    media = media_root(settings.data_dir)
    media.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(media)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}); the EDQUOT test below simulates")
    try:
        yield media
    finally:
        subprocess.run(["umount", "-l", str(media)], check=True)


def test_an_upload_onto_a_full_disk_answers_507_and_leaves_nothing(settings: Settings, tmpfs_media: Path) -> None:
    image = noise_png(160)  # ~77 KB
    with api_client(settings) as client:
        assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        filler = tmpfs_media / "filler"
        with open(filler, "wb") as f:  # fill the disk but for 16 KiB
            f.write(b"\0" * (1024 * 1024 - 16 * 1024))
        full = upload(client, image)
        assert full.status_code == 507, full.text
        assert full.json()["error"]["code"] == "storage_full"
        filler.unlink()
        assert_nothing_stored(client, tmpfs_media)
        assert upload(client, image).status_code == 201  # space again: the same upload goes in


def test_a_quota_exceeded_while_writing_answers_507_and_removes_the_temp_file(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Simulated (a quota cannot be set up in a test): the temp file exists and holds bytes when fsync fails.
    media = media_root(settings.data_dir)
    written: list[Path] = []
    real_fsync = os.fsync

    def over_quota(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if not path.is_relative_to(media):
            return real_fsync(fd)  # SQLite, FAISS: their disk is fine
        written.append(path)
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    with api_client(settings) as client:
        assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        monkeypatch.setattr(os, "fsync", over_quota)
        full = upload(client, image_bytes((10, 20, 30)))
        monkeypatch.undo()
        assert full.status_code == 507, full.text
        assert full.json()["error"]["code"] == "storage_full"
        assert len(written) == 1 and ".tmp-" in written[0].name  # there was a temp file…
        assert not written[0].exists()  # …and it is gone
        assert_nothing_stored(client, media)


def test_a_full_disk_while_saving_the_index_file_fails_no_upload_and_leaves_no_temp_file(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings.model_copy(update={"index_save_interval_s": 0})  # every write saves the FAISS file
    indexes = settings.data_dir / "indexes"
    real_fsync = os.fsync

    def disk_full_for_index_files(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if path.is_relative_to(indexes) and ".tmp-" in path.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    with api_client(settings) as client:
        assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        monkeypatch.setattr(os, "fsync", disk_full_for_index_files)
        added = upload(client, image_bytes((10, 20, 30)))
        assert added.status_code == 201, added.text  # SQL has it: the file is derived data
        found = client.post("/v1/search/text", json={"query": "猫", "collection": "photos"}).json()["results"]
        assert [hit["id"] for hit in found] == [added.json()["id"]]
        assert not list(indexes.rglob("*.tmp-*"))
        assert any("index file not saved" in r.getMessage() for r in caplog.records)
        monkeypatch.undo()  # space again: the file is saved at the next change or on close
    with api_client(settings) as client:
        assert client.get("/v1/collections/photos").json()["vectors"] == 1


def age(path: Path) -> Path:
    os.utime(path, (OLD, OLD))
    return path


def leftovers(media: Path) -> dict[str, Path]:
    """Files a killed process could have left, next to a referenced copy, each old or fresh."""
    shard = media / "ab"
    shard.mkdir(parents=True, exist_ok=True)
    files = {
        "old_orphan": shard / f"ab{'1' * 62}.png",
        "fresh_orphan": shard / f"ab{'2' * 62}.jpg",
        "old_temp": shard / f"ab{'3' * 62}.png.tmp-4242-1",
        "fresh_temp": shard / f"ab{'4' * 62}.png.tmp-4243-1",
        "old_unknown": shard / "notes.txt",
    }
    for path in files.values():
        path.write_bytes(b"x")
    for key in ("old_orphan", "old_temp", "old_unknown"):
        age(files[key])
    return files


def test_serve_sweeps_orphans_and_stale_temp_files_at_start(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    media = media_root(settings.data_dir)
    with api_client(settings) as client:
        assert client.post("/v1/collections", json={"name": "photos", "kind": "images"}).status_code == 201
        item = upload(client, image_bytes((200, 30, 40))).json()["id"]
    kept = media_file(media, hashlib.sha256(image_bytes((200, 30, 40))).hexdigest(), "image/png")
    age(kept)  # old, but a row names it
    files = leftovers(media)

    caplog.set_level(logging.INFO, logger="indexer.storage.media.sweep")
    with TestClient(create_app(settings, encoder=FakeEncoder())) as client:  # the lifespan opens the catalog
        assert client.get(f"/v1/items/{item}/image").status_code == 200
    assert kept.exists()
    assert {k for k, p in files.items() if p.exists()} == {"fresh_orphan", "fresh_temp", "old_unknown"}
    lines = [r.getMessage() for r in caplog.records if r.name == "indexer.storage.media.sweep"]
    assert len(lines) == 1 and "removed 1 orphaned upload copies and 1 stale temp files" in lines[0]


def test_index_sweeps_at_start(settings: Settings, tmp_path: Path, toy_model_dir: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import build_cli

    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.png").write_bytes(image_bytes((1, 2, 3)))
    files = leftovers(media_root(settings.data_dir))
    env = {"CNCLIP_DATA_DIR": str(settings.data_dir), "CNCLIP_MODEL_DIR": str(toy_model_dir), "CNCLIP_PROVIDER": "cpu"}
    result = CliRunner().invoke(build_cli(), ["index", str(folder), "--collection", "photos"], env=env)
    assert result.exit_code == 0, result.output
    assert not files["old_orphan"].exists() and not files["old_temp"].exists()
    assert files["fresh_orphan"].exists() and files["fresh_temp"].exists()


def test_the_sweep_waits_for_a_write_in_flight_and_keeps_what_it_commits(tmp_path: Path) -> None:
    """Another process's upload: its copy is written, its row not yet committed. A sweep that runs
    now (grace 0, so age cannot save the copy) must wait for the commit, then see the row."""
    media = tmp_path / "media"
    sha = "cd" + "5" * 62
    committed: set[str] = set()
    written = threading.Event()

    def writer() -> None:
        with media_writes(media):
            store_media(media, sha, "image/png", b"bytes")
            written.set()
            time.sleep(0.5)  # the INSERT and COMMIT
            committed.add(sha)

    thread = threading.Thread(target=writer)
    thread.start()
    assert written.wait(5)
    started = time.monotonic()
    result = sweep_media(media, lambda shas: committed & set(shas), grace_s=0)
    thread.join()
    assert time.monotonic() - started >= 0.3  # it waited for the writer's lock
    assert result.orphans == 0 and media_file(media, sha, "image/png").exists()


def test_a_sweep_while_another_process_uploads_removes_nothing(tmp_path: Path) -> None:
    media = tmp_path / "media"
    files = leftovers(media)
    holder = subprocess.Popen(  # another process, between writing a copy and committing its row
        [sys.executable, "-c", HOLD_THE_MEDIA_LOCK, str(media)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        result = sweep_media(media, lambda shas: set(), lock_wait_s=0.3)
    finally:
        holder.kill()
        holder.wait()
    assert result.skipped and all(p.exists() for p in files.values())
    assert sweep_media(media, lambda shas: set()).orphans == 1  # once it is free


HOLD_THE_MEDIA_LOCK = """
import sys, time
from pathlib import Path
from indexer.storage.media.store import media_writes
with media_writes(Path(sys.argv[1])):
    print("holding", flush=True)
    time.sleep(60)
"""
