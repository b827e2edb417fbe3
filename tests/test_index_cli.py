"""`cnclip index / index-texts / stats / search` with the toy model, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
from sqlalchemy import create_engine
from typer.testing import CliRunner, Result

from api.cli import build_cli
from indexer.db import create_db_engine
from indexer.vector_index import VectorIndex
from retrieval.manifest import ModelManifest
from tests.indexer_helpers import (
    catalog_settings,
    cli_env,
    faiss_file,
    open_test_catalog,
    start_cli,
    wait_for_items,
    write_images,
)


def invoke(args: list[str], env: dict[str, str]) -> Result:
    return CliRunner().invoke(build_cli(), args, env=env)


def test_index_stats_search_and_texts(tmp_path: Path, database_url: str, toy_model_dir: Path) -> None:
    env = cli_env(tmp_path / "data", database_url, toy_model_dir)
    folder = tmp_path / "photos"
    images = write_images(folder, 10)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 cut short")
    (folder / "readme.txt").write_text("hello")
    report = tmp_path / "bad.jsonl"

    result = invoke(["index", str(folder), "--collection", "photos", "--report", str(report)], env)
    assert result.exit_code == 0, result.output
    assert "indexed 10 new" in result.output and "not images 1" in result.output and "failed 1" in result.output
    assert f"bad: {folder / 'broken.jpg'}: " in result.output
    bad = [json.loads(line) for line in report.read_text().splitlines()]
    assert [row["path"] for row in bad] == [str(folder / "broken.jpg")] and bad[0]["reason"]

    model = ModelManifest.load(toy_model_dir).model_id
    stats = invoke(["stats", "--json"], env)
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.output.strip().splitlines()[-1]) == {
        "collections": [
            {
                "name": "photos",
                "kind": "images",
                "items": 10,
                "vectors": 10,
                "deleted": 0,
                "model": model,
                "index": "Flat",
            }
        ]
    }

    found = invoke(["search", "红色的花", "--collection", "photos", "-k", "3", "--json"], env)
    assert found.exit_code == 0, found.output
    answer = json.loads(found.output.strip().splitlines()[-1])
    scores = [hit["score"] for hit in answer["results"]]
    assert answer["collection"] == "photos" and len(scores) == 3 and scores == sorted(scores, reverse=True)
    assert {hit["path"] for hit in answer["results"]} <= {str(p) for p in images}

    again = invoke(["index", str(folder), "--collection", "photos"], env)
    assert again.exit_code == 0 and "indexed 0 new" in again.output and "unchanged 10" in again.output
    dry = invoke(["index", str(folder), "--collection", "photos", "--dry-run"], env)
    assert "dry run: 2 files to read and embed, 10 unchanged" in dry.output

    lines = tmp_path / "captions.txt"
    lines.write_text("一只猫\n一辆红色的汽车\n\n一只猫\n", encoding="utf-8")
    jsonl = tmp_path / "captions.jsonl"
    jsonl.write_text('{"text": "一只狗", "tags": ["animal"]}\n{"text": "一辆红色的汽车"}\n', encoding="utf-8")
    assert "2 texts added, 1 already there" in invoke(["index-texts", str(lines), "-c", "captions"], env).output
    assert "1 texts added, 1 already there" in invoke(["index-texts", str(jsonl), "-c", "captions"], env).output
    rows = json.loads(invoke(["stats", "--json"], env).output.strip().splitlines()[-1])["collections"]
    assert [(r["name"], r["kind"], r["items"], r["vectors"]) for r in rows] == [
        ("photos", "images", 10, 10),
        ("captions", "texts", 3, 3),
    ]

    wrong = invoke(["index", str(folder), "--collection", "captions"], env)
    assert wrong.exit_code == 1 and "error: collection 'captions' holds texts" in wrong.output
    assert "Traceback" not in wrong.output
    missing = invoke(["search", "x", "--collection", "nope"], env)
    assert missing.exit_code == 1 and "no collection named 'nope'" in missing.output


def test_ctrl_c_stops_cleanly_and_a_rerun_resumes(tmp_path: Path, database_url: str, toy_model_dir: Path) -> None:
    folder = tmp_path / "photos"
    write_images(folder, 80)
    env = cli_env(tmp_path / "data", database_url, toy_model_dir, CNCLIP_INDEX_BATCH_SIZE="4", CNCLIP_BUCKETS="[1,4]")
    engine = create_db_engine(database_url) if database_url.startswith("sqlite") else create_engine(database_url)
    process = start_cli(["index", str(folder), "--collection", "photos"], env)
    assert wait_for_items(engine, process, at_least=4), "the run ended before it could be interrupted"
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    assert "interrupted: everything committed is kept" in output and "Traceback" not in output

    # The clean stop saved FAISS: the file on disk already equals SQL, before any reconcile.
    catalog = open_test_catalog(tmp_path / "probe", database_url)
    info = catalog.get_collection("photos")
    sql_ids = catalog.sql_ids("photos")
    catalog.engine.dispose()
    assert 4 <= len(sql_ids) < 80
    settings = catalog_settings(tmp_path / "data", database_url)
    on_disk = faiss_file(settings, info.id)
    saved = VectorIndex.load(on_disk, info.dim, info.index, info.model)
    assert np.array_equal(np.sort(saved.ids()), sql_ids)

    rerun = start_cli(["index", str(folder), "--collection", "photos"], env)
    output, _ = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, output
    assert f"indexed {80 - len(sql_ids)} new" in output and f"unchanged {len(sql_ids)}" in output
    engine.dispose()
