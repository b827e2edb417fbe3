import json
from pathlib import Path

import pytest

from retrieval.errors import ModelError
from retrieval.manifest import MANIFEST_NAME, ModelManifest, same_model
from retrieval.toolchain.toy_model import write_toy_model


def test_toy_manifest_round_trips(toy_model_dir: Path) -> None:
    manifest = ModelManifest.load(toy_model_dir)
    assert manifest.embed_dim == 32
    assert manifest.towers["text"].buckets("fp32") == [1, 4, 8, 16, 32]
    assert manifest.towers["image"].precisions() == ["fp32", "int8"]
    assert manifest.graph_path("text", "int8", 8).name == "text.int8.b8.onnx"
    # Every graph and the shared weight files are hashed.
    assert "text.fp32.data" in manifest.files and "image.int8.b32.onnx" in manifest.files


def test_model_id_changes_with_any_file(toy_model_dir: Path) -> None:
    manifest = ModelManifest.load(toy_model_dir)
    name, fingerprint = manifest.model_id.split("@")
    assert name == manifest.name and len(fingerprint) == 12
    assert ModelManifest.load(toy_model_dir).model_id == manifest.model_id  # stable
    # Retrained weights under the same name: another id, so old collections are not searched with it.
    changed = {**manifest.files, "text.fp32.data": "0" * 64}
    assert ModelManifest(**{**manifest.__dict__, "files": changed}).model_id != manifest.model_id
    assert ModelManifest(**{**manifest.__dict__, "files": {}}).model_id == manifest.name
    assert same_model(manifest.model_id, manifest.model_id) and same_model("toy", manifest.model_id)
    assert not same_model("toy@000000000000", manifest.model_id) and not same_model("other", manifest.model_id)


def test_corrupt_file_is_named(tmp_path: Path) -> None:
    write_toy_model(tmp_path, buckets=(1,), int8=False)
    with (tmp_path / "text.fp32.data").open("r+b") as f:
        f.write(b"\xff\xff")
    with pytest.raises(ModelError, match=r"text\.fp32\.data"):
        ModelManifest.load(tmp_path)


def test_missing_file_and_bad_fields_are_named(tmp_path: Path) -> None:
    write_toy_model(tmp_path, buckets=(1,), int8=False)
    (tmp_path / "image.fp32.b1.onnx").unlink()
    with pytest.raises(ModelError, match="model file missing"):
        ModelManifest.load(tmp_path)
    raw = json.loads((tmp_path / MANIFEST_NAME).read_text())
    del raw["embed_dim"]
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(raw))
    with pytest.raises(ModelError, match="missing field 'embed_dim'"):
        ModelManifest.load(tmp_path, verify=False)
    with pytest.raises(ModelError, match="no manifest.json"):
        ModelManifest.load(tmp_path / "nowhere")
