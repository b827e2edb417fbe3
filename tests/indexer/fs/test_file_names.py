"""File names that are not valid UTF-8 (issue 21 #7): such a file is indexed like any other on
SQLite and PostgreSQL, its stored path gives back the very bytes (so `/image` opens it), a rerun
finds it unchanged, and people see it as `\\xff` (CLI lines, report, API), never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sqlalchemy import create_engine
from typer.testing import CliRunner

from cli.main import build_cli
from indexer.fs.file_names import SQL_PREFIX, from_sql, printable, to_sql
from tests.support.api_helpers import api_client
from tests.support.indexer_helpers import catalog_settings, cli_env, open_test_catalog, png

TEXT_PATHS = ["/photos/a.png", "/照片/猫 1.jpg", "/p/100%.png", "/p/%FF.png", "bytes:/p/x.png", "/p/bytes:x.png", ""]
BYTE_PATHS = [
    b"/p/img-\xff.png",
    b"/\xc3\x28/x.png",
    b"/p/%FF-\xff.png",
    b"/p/\xe7\x85.png",
    b"bytes:/\xff",
    b"/\x80\xfe",
]


def test_sql_text_round_trips_every_name_and_leaves_text_names_as_they_are() -> None:
    names = TEXT_PATHS + [os.fsdecode(raw) for raw in BYTE_PATHS]
    stored = [to_sql(name) for name in names]
    for name, text in zip(names, stored, strict=True):
        text.encode("utf-8")  # what both databases take
        assert from_sql(text) == name
    assert len(set(stored)) == len(names)  # one-to-one
    assert stored[:3] == TEXT_PATHS[:3] and stored[3] == "/p/%FF.png"  # existing rows keep their text
    assert to_sql(os.fsdecode(b"/p/img-\xff.png")) == SQL_PREFIX + "/p/img-%FF.png"
    assert os.fsencode(from_sql(to_sql(os.fsdecode(b"/p/%FF-\xff.png")))) == b"/p/%FF-\xff.png"
    assert printable(os.fsdecode(b"/p/img-\xff.png")) == "/p/img-\\xff.png" and printable("/照片") == "/照片"


def _index(env: dict[str, str], folder: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(build_cli(), ["index", str(folder), "-c", "photos", *args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


def test_a_non_utf8_file_name_is_indexed_served_and_unchanged_on_rerun(
    tmp_path: Path, database_url: str, toy_model_dir: Path
) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(40):
        (folder / f"img{i:06d}.png").write_bytes(png(i))
    odd_name = os.fsencode(folder) + b"/img000020-\xff.png"
    odd_bytes = png(999)
    with open(odd_name, "wb") as f:
        f.write(odd_bytes)
    broken_name = os.fsencode(folder) + b"/broken-\xfe.png"
    with open(broken_name, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n cut short")
    env = cli_env(tmp_path / "data", database_url, toy_model_dir)
    report = tmp_path / "bad.jsonl"

    code, output = _index(env, folder, "--batch-size", "8", "--report", str(report))
    # Before: exit 1 with a traceback at the batch holding img000020-\xff.png, on every rerun.
    assert code == 3 and "indexed 41 new" in output and "failed 1" in output, output
    assert f"bad: {folder}/broken-\\xfe.png: " in output
    (bad,) = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert bad["path"] == f"{folder}/broken-\\xfe.png" and bad["reason"]

    settings = catalog_settings(tmp_path / "data", database_url)
    catalog = open_test_catalog(tmp_path / "data", database_url)
    try:
        states = catalog.file_states("photos")
        assert os.fsdecode(odd_name) in states and len(states) == 41
        item_id = states[os.fsdecode(odd_name)].id
        (record,) = catalog.get_many([item_id])
        assert os.fsencode(record.path or "") == odd_name  # the very bytes: the file opens
        with api_client(settings, catalog=catalog) as client:
            answer = client.get(f"/v1/items/{item_id}/image")
            assert answer.status_code == 200 and answer.content == odd_bytes
            item = client.get(f"/v1/items/{item_id}").json()
            assert item["filename"] == "img000020-\\xff.png" and item["path"] == "img000020-\\xff.png"
    finally:
        catalog.close()
    raw = create_engine(database_url)
    try:
        with raw.connect() as connection:
            stored = connection.exec_driver_sql(f"SELECT path FROM items WHERE id = {item_id}").scalar()
        assert stored == SQL_PREFIX + f"{folder}/img000020-%FF.png"
    finally:
        raw.dispose()

    code, output = _index(env, folder, "--prune")  # the rerun does not stop, and prune keeps the file
    assert code == 3 and "indexed 0 new" in output and "unchanged 41" in output and "pruned 0" in output, output
    os.rename(odd_name, os.fsencode(folder) + b"/moved-\xff\xfe.png")
    code, output = _index(env, folder)
    assert code == 3 and "indexed 0 new" in output and "1 renamed" in output, output
    found = CliRunner().invoke(build_cli(), ["search", "照片", "-c", "photos", "-k", "50", "--json"], env=env)
    assert found.exit_code == 0, found.output
    paths = {hit["path"] for hit in json.loads(found.output.strip().splitlines()[-1])["results"]}
    assert f"{folder}/moved-\\xff\\xfe.png" in paths and len(paths) == 41


def test_a_manifest_path_no_file_can_have_is_a_reported_line(tmp_path: Path, toy_model_dir: Path) -> None:
    (tmp_path / "good.png").write_bytes(png(1))
    manifest = tmp_path / "list.jsonl"  # relative paths: relative to the manifest's folder
    lines = [{"path": "good.png"}, {"path": "bad-\ud800.png"}, {"path": "nul\x00.png"}, {"path": "odd-\udcff.png"}]
    manifest.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    (tmp_path / "odd-\udcff.png").write_bytes(png(2))  # JSON's \udcff escape names the byte 0xff
    env = cli_env(tmp_path / "data", f"sqlite:///{tmp_path / 'catalog.db'}", toy_model_dir)
    code, output = _index(env, manifest)
    # The byte-named file is indexed; the two impossible names are reported lines saying why.
    assert code == 3 and "indexed 2 new" in output and "failed 2" in output, output
    assert f"bad: {manifest}:2: not a file name" in output and f"bad: {manifest}:3: a file name cannot" in output
