"""`cnclip duplicates` with the toy model, on SQLite and PostgreSQL: the groups on the terminal and as
JSON (the API's fields), the similar-shots search run to its end, options checked before anything
opens, and a missing or text collection in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from cli import duplicates as duplicates_cli
from cli.main import build_cli
from indexer.domain import near_vectors
from tests.support.indexer_helpers import cli_env, write_images


def invoke(args: list[str], env: dict[str, str]) -> Result:
    return CliRunner().invoke(build_cli(), args, env=env)


def test_duplicates_on_the_terminal_and_as_json(tmp_path: Path, database_url: str, toy_model_dir: Path) -> None:
    env = cli_env(tmp_path / "data", database_url, toy_model_dir)
    folder = tmp_path / "photos"
    write_images(folder, 6)
    shutil.copy(folder / "0001.jpg", folder / "copy of 0001.jpg")
    (folder / "old").mkdir()
    shutil.copy(folder / "0001.jpg", folder / "old" / "0001.jpg")
    assert invoke(["index", str(folder), "--collection", "photos"], env).exit_code == 0

    result = invoke(["duplicates", "--collection", "photos", "--tier", "identical"], env)
    assert result.exit_code == 0, result.output
    # Before the groups: the calibration of the similar-shots threshold with the toy model (stderr).
    assert result.output.splitlines()[0].startswith("photos: measuring where similar shots start")
    lines = [line for line in result.output.splitlines() if not line.startswith("photos: measuring")]
    assert lines[0] == "1. identical bytes (3); keep: the same bytes at every path: the item itself is kept"
    assert lines[1].lstrip().startswith("keep") and lines[1].endswith(str(folder / "0001.jpg"))
    assert [line.split()[0] for line in lines[2:4]] == ["copy", "copy"]
    assert lines[2].endswith("copy of 0001.jpg") and lines[3].endswith(str(folder / "old" / "0001.jpg"))
    assert "photos: 1 identical bytes, 0 the same picture, re-encoded or resized, 0 similar shots" in result.output
    # 6 items are too few to calibrate: the toy model's default threshold, saying why.
    assert "NOT measured for this model" in result.output and "too few photos to measure" in result.output

    as_json = invoke(["duplicates", "-c", "PHOTOS", "--json", "--threshold", "0.99"], env)
    assert as_json.exit_code == 0, as_json.output
    body = json.loads(as_json.output)
    assert body["collection"] == "photos" and body["complete"] is True
    assert (body["similar_threshold"], body["similar_threshold_source"]) == (0.99, "request")
    [group] = [g for g in body["groups"] if g["tier"] == "identical"]
    assert [m["copy_of_item"] for m in group["members"]] == [False, True, True]
    assert {m["id"] for m in group["members"]} == {group["keeper"]}


def test_a_long_search_is_run_to_its_end(tmp_path: Path, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(duplicates_cli, "STEP_S", 1e-6)
    monkeypatch.setattr(near_vectors, "QUERY_CHUNK", 2)
    env = cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'c.db'}", toy_model_dir)
    write_images(tmp_path / "photos", 7)
    assert invoke(["index", str(tmp_path / "photos"), "--collection", "photos"], env).exit_code == 0
    result = invoke(["duplicates", "--collection", "photos", "--json"], env)
    assert result.exit_code == 0, result.output
    body = json.loads(result.output.splitlines()[-1])
    assert body["complete"] is True


def test_options_and_collections_are_checked(tmp_path: Path, toy_model_dir: Path) -> None:
    env = cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'c.db'}", toy_model_dir)
    for bad in (["--limit", "0"], ["--limit", "101"], ["--offset", "-1"], ["--tier", "bogus"], ["--threshold", "0.1"]):
        result = invoke(["duplicates", "--collection", "photos", *bad], env)
        assert result.exit_code == 2, (bad, result.output)
    missing = invoke(["duplicates", "--collection", "nothing"], env)
    assert missing.exit_code == 1 and missing.output.strip() == "error: no collection named 'nothing'"
    assert invoke(["duplicates", "--collection", "a b"], env).exit_code == 1
    texts = tmp_path / "texts.txt"
    texts.write_text("一只猫\n", encoding="utf-8")
    assert invoke(["index-texts", str(texts), "--collection", "words"], env).exit_code == 0
    refused = invoke(["duplicates", "--collection", "words"], env)
    assert refused.exit_code == 1 and "holds texts" in refused.output and "Traceback" not in refused.output


def test_hash_missing_hashes_rows_from_before_perceptual_hashes(tmp_path: Path, toy_model_dir: Path) -> None:
    from sqlalchemy import create_engine, text

    url = f"sqlite:///{tmp_path / 'c.db'}"
    env = cli_env(tmp_path / "data", url, toy_model_dir)
    write_images(tmp_path / "photos", 4)
    assert invoke(["index", str(tmp_path / "photos"), "--collection", "photos"], env).exit_code == 0
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE items SET phash = NULL"))
    engine.dispose()
    before = invoke(["duplicates", "--collection", "photos"], env)
    assert "4 images have no perceptual hash yet" in before.output
    result = invoke(["duplicates", "--collection", "photos", "--hash-missing", "--json"], env)
    assert result.exit_code == 0, result.output
    assert "photos: 4 images hashed" in result.output
    assert json.loads(result.output.splitlines()[-1])["unhashed"] == 0
