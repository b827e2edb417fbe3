"""JSON nested deeper than Python's parser follows is malformed JSON everywhere it comes from outside:
a manifest or texts file given to the CLI, a model's manifest, a tuning file, an index file's header.
(Request bodies: tests/contract/test_bad_input_corpus.py.) `json.loads` raises RecursionError there, which the
callers' `except JSONDecodeError` did not catch: a traceback instead of one line."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import build_cli
from indexer.storage.vectors.faiss.file import MAGIC
from indexer.storage.vectors.faiss.index import IndexFileError, VectorIndex
from retrieval.errors import ModelError
from retrieval.json_text import JSONTooDeep, loads
from retrieval.manifest import ModelManifest
from tests.support.indexer_helpers import cli_env, write_images

DEEP = "[" * 5000 + "]" * 5000


def test_loads_turns_the_recursion_limit_into_a_decode_error() -> None:
    with pytest.raises(RecursionError):
        json.loads(DEEP)  # what the callers met before
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        loads(DEEP)
    assert isinstance(JSONTooDeep("x", "", 0), ValueError)
    assert loads('[[1], {"a": [2]}]') == [[1], {"a": [2]}]


@pytest.mark.parametrize("command", ["index", "index-texts"])
def test_a_deeply_nested_line_is_one_error_line(tmp_path: Path, toy_model_dir: Path, command: str) -> None:
    source = tmp_path / "rows.jsonl"
    write_images(tmp_path / "photos", 1)
    good = {"path": "photos/0000.jpg"} if command == "index" else {"text": "红色的星星"}
    source.write_text(json.dumps(good) + "\n" + DEEP + "\n", encoding="utf-8")
    env = cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'db.sqlite'}", toy_model_dir)
    result = CliRunner().invoke(build_cli(), [command, str(source), "--collection", "c"], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "nested too deeply" in result.output and "Traceback" not in result.output
    assert result.exit_code in (1, 3), result.output  # index: the line is a bad file (3); texts: an error (1)


def test_a_model_manifest_nested_too_deeply_is_a_model_error(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(DEEP, encoding="utf-8")
    with pytest.raises(ModelError, match="not valid JSON"):
        ModelManifest.load(tmp_path)


def test_an_index_file_with_a_hostile_header_is_refused_not_loaded(tmp_path: Path) -> None:
    """A header with a valid checksum that is nested too deeply, not an object, or lacks a field."""
    for header in (DEEP.encode(), b"[1, 2]", b'{"dim": 4}', b'{"dim": 4, "factory": "Flat", "model": "m"}'):
        body = b""
        crc = zlib.crc32(body, zlib.crc32(header))
        path = tmp_path / "x.faiss"
        path.write_bytes(MAGIC + struct.pack("<IQ", len(header), len(body)) + header + body + struct.pack("<I", crc))
        with pytest.raises(IndexFileError, match="unreadable header"):
            VectorIndex.load(path, 4, "Flat", "m")
