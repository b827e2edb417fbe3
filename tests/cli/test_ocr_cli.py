"""`cnclip index --ocr` and `cnclip ocr` (cli/ocr.py) with the toy model, on SQLite and PostgreSQL: the
flag is the collection's and stays on for later runs; `cnclip ocr` fills an indexed collection without
embedding, resumably (`--limit`), with a `--json` summary and `cnclip index`'s exit statuses; one run
reads rendered signs with the real engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from cli.main import build_cli
from indexer.storage.catalog import SqlCatalog
from tests.support.indexer_helpers import cli_env, open_test_catalog
from tests.support.ocr_fakes import FakeOcrEngine, png_with_text
from tests.support.ocr_pictures import PICTURES, render_text_picture


def invoke(args: list[str], env: dict[str, str]) -> Result:
    return CliRunner().invoke(build_cli(), args, env=env)


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> FakeOcrEngine:
    engine = FakeOcrEngine()
    monkeypatch.setattr("indexer.runtime.open_rapidocr", lambda *args, **kwargs: engine)
    return engine


def _texts(tmp_path: Path, database_url: str) -> dict[str, str]:
    catalog: SqlCatalog = open_test_catalog(tmp_path / "data", database_url)
    try:
        states = catalog.file_states("photos")
        found = catalog.texts.texts_for([s.id for s in states.values()])
        return {Path(path).name: found[s.id].text for path, s in states.items() if s.id in found}
    finally:
        catalog.close()


def _photos(folder: Path, count: int, first: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(first, first + count):
        (folder / f"p{n}.png").write_bytes(png_with_text(f"第{n}号", seed=n))


def test_index_with_ocr_keeps_it_on_for_later_runs(
    tmp_path: Path, database_url: str, toy_model_dir: Path, fake_engine: FakeOcrEngine
) -> None:
    env = cli_env(tmp_path / "data", database_url, toy_model_dir)
    folder = tmp_path / "photos"
    _photos(folder, 3)
    first = invoke(["index", str(folder), "-c", "photos", "--ocr", "--json"], env)
    assert first.exit_code == 0, first.output
    assert json.loads(first.output.strip().splitlines()[-1])["read_for_text"] == 3
    _photos(folder, 2, first=3)
    second = invoke(["index", str(folder), "-c", "photos"], env)  # no --ocr: the collection has it
    assert second.exit_code == 0, second.output
    assert "read for text 2" in second.output
    assert _texts(tmp_path, database_url) == {f"p{n}.png": f"第{n}号" for n in range(5)}


def test_ocr_fills_an_indexed_collection_resumably(
    tmp_path: Path, database_url: str, toy_model_dir: Path, fake_engine: FakeOcrEngine
) -> None:
    env = cli_env(tmp_path / "data", database_url, toy_model_dir)
    folder = tmp_path / "photos"
    _photos(folder, 5)
    assert invoke(["index", str(folder), "-c", "photos"], env).exit_code == 0
    assert fake_engine.calls == 0 and _texts(tmp_path, database_url) == {}

    part = invoke(["ocr", "-c", "photos", "--limit", "2", "--json"], env)
    assert part.exit_code == 0, part.output
    summary = json.loads(part.output.strip().splitlines()[-1])
    assert (summary["items"], summary["missing"], summary["read"], summary["with_text"]) == (5, 5, 2, 2)
    assert summary["engine"] == "fake-ocr 1" and summary["interrupted"] is False

    (folder / "p4.png").unlink()  # gone since it was indexed: not read, exit status 3
    rest = invoke(["ocr", "-c", "photos"], env)
    assert rest.exit_code == 3, rest.output
    assert "2 photos read (2 with text)" in rest.output and "not read: item" in rest.output
    assert len(_texts(tmp_path, database_url)) == 4 and fake_engine.calls == 4

    _photos(folder, 1, first=4)  # back: the next fill reads it
    last = invoke(["ocr", "-c", "photos", "--json"], env)
    assert last.exit_code == 0, last.output
    assert json.loads(last.output.strip().splitlines()[-1])["read"] == 1


def test_ocr_refuses_a_text_collection_and_an_unknown_one(
    tmp_path: Path, database_url: str, toy_model_dir: Path, fake_engine: FakeOcrEngine
) -> None:
    env = cli_env(tmp_path / "data", database_url, toy_model_dir)
    texts = tmp_path / "captions.txt"
    texts.write_text("一只猫\n")
    assert invoke(["index-texts", str(texts), "-c", "captions"], env).exit_code == 0
    refused = invoke(["ocr", "-c", "captions"], env)
    assert refused.exit_code == 1 and "only image collections" in refused.output
    unknown = invoke(["ocr", "-c", "nope"], env)
    assert unknown.exit_code == 1 and "nope" in unknown.output


def test_index_ocr_reads_rendered_signs_with_the_real_engine(
    tmp_path: Path, database_url: str, toy_model_dir: Path
) -> None:
    env = cli_env(tmp_path / "data", database_url, toy_model_dir)
    folder = tmp_path / "signs"
    folder.mkdir()
    for picture in PICTURES[:2]:
        render_text_picture(picture).save(folder / f"{picture.name}.jpg", "JPEG", quality=90)
    result = invoke(["index", str(folder), "-c", "photos", "--ocr"], env)
    assert result.exit_code == 0, result.output
    texts = {name: "".join(text.split()) for name, text in _texts(tmp_path, database_url).items()}
    assert "北京烤鸭" in texts["sign-kaoya.jpg"] and "安全出口B" in texts["sign-exit.jpg"]


def test_ocr_without_an_engine_is_one_line_and_status_1(
    tmp_path: Path, database_url: str, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from retrieval.errors import ModelError

    def broken(*args: object, **kwargs: object) -> FakeOcrEngine:
        raise ModelError("the OCR models are missing")

    monkeypatch.setattr("indexer.runtime.open_rapidocr", broken)
    env = cli_env(tmp_path / "data", database_url, toy_model_dir)
    _photos(tmp_path / "photos", 2)
    indexed = invoke(["index", str(tmp_path / "photos"), "-c", "photos", "--ocr"], env)
    assert indexed.exit_code == 0, indexed.output  # indexed all the same, without text
    assert _texts(tmp_path, database_url) == {}
    result = invoke(["ocr", "-c", "photos"], env)
    assert result.exit_code == 1 and "the OCR models are missing" in result.output
    assert "Traceback" not in result.output
