"""`cnclip index / index-texts / stats / search` with the toy model, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine
from typer.testing import CliRunner, Result

from cli.main import build_cli
from indexer.storage.sql.db import create_db_engine
from indexer.storage.vectors.faiss.delta import delta_path
from indexer.storage.vectors.faiss.index import VectorIndex
from retrieval.manifest import ModelManifest
from tests.support.indexer_helpers import (
    catalog_settings,
    cli_env,
    faiss_file,
    jpeg,
    open_test_catalog,
    run_cnclip,
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
    assert result.exit_code == 3, result.output  # some files failed: the others are indexed
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
                "index": "Auto",  # the default for new collections: Flat until CNCLIP_INDEX_AUTO_IVF_MIN, then IVF
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
    assert again.exit_code == 3 and "indexed 0 new" in again.output and "unchanged 10" in again.output
    assert "images/s" not in again.output  # nothing embedded: no rate
    dry = invoke(["index", str(folder), "--collection", "photos", "--dry-run"], env)
    # Exactly what a real run embeds after a complete one: nothing (broken.jpg is read again, and fails again).
    assert "dry run: 0 images to embed, 0 to date, 10 unchanged" in dry.output and "1 unreadable" in dry.output
    good = tmp_path / "good"
    write_images(good, 3)
    assert invoke(["index", str(good), "--collection", "photos"], env).exit_code == 0  # every file indexed

    paged = invoke(["search", "红色的花", "-c", "photos", "-k", "2", "--offset", "2", "--sort", "taken", "--json"], env)
    assert paged.exit_code == 0, paged.output
    page = json.loads(paged.output.strip().splitlines()[-1])
    assert len(page["results"]) == 2 and page["total"] == 10 and page["has_more"] is True  # good/ holds duplicates
    assert all(hit["taken_at_source"] == "mtime" for hit in page["results"])
    cut = invoke(["search", "红色的花", "-c", "photos", "--min-score", "1", "--json"], env)
    assert json.loads(cut.output.strip().splitlines()[-1])["results"] == []

    lines = tmp_path / "captions.txt"
    lines.write_text("一只猫\n一辆红色的汽车\n\n一只猫\n", encoding="utf-8")
    jsonl = tmp_path / "captions.jsonl"
    jsonl.write_text('{"text": "一只狗", "tags": ["animal"]}\n{"text": "一辆红色的汽车"}\n', encoding="utf-8")
    assert "2 texts added, 1 already there" in invoke(["index-texts", str(lines), "-c", "captions"], env).output
    assert "1 text added, 1 already there" in invoke(["index-texts", str(jsonl), "-c", "captions"], env).output
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
    texts = invoke(["search", "一只猫", "--collection", "captions"], env)  # text → text: refused, like the API
    assert texts.exit_code == 1 and "needs an image collection" in texts.output


def test_usage_version_help_and_early_checks(tmp_path: Path, toy_model_dir: Path) -> None:
    """Usage errors exit 2, project errors 1, and bad paths, names and limits are refused before
    the catalog or the model is opened (the toy model dir does not even exist here)."""
    env = cli_env(tmp_path / "data", "sqlite:///" + str(tmp_path / "db.sqlite"), tmp_path / "no-model")
    from importlib.metadata import version

    assert invoke(["--version"], env).output.strip() == version("cnclip-search")
    helped = invoke(["-h"], env)
    assert helped.exit_code == 0 and "Exit status: 0 all good" in helped.output and "130" in helped.output
    index_help = invoke(["index", "-h"], env).output
    assert "--dry-run" in index_help and "<bool>" not in index_help and "BOOLEAN" not in index_help
    assert invoke(["search", "x", "-k", "201"], env).exit_code == 2  # the API's MAX_K is 200
    assert invoke(["search", "x", "-k", "200", "--sort", "date"], env).exit_code == 2
    assert invoke(["index"], env).exit_code == 2
    for args, message in [
        (["index", str(tmp_path / "nowhere"), "-c", "photos"], "does not exist"),
        (["index", str(tmp_path), "-c", "bad name!"], "collection name"),
        (["index-texts", str(tmp_path / "none.txt"), "-c", "t"], "is not a file"),
        (["search", "x", "-c", "bad/name"], "collection name"),
        (["search", "   ", "-c", "photos"], "the query is empty"),
    ]:
        result = invoke(args, env)
        assert result.exit_code == 1, (args, result.output)
        assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "db.sqlite").exists()  # refused before the catalog was opened


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


def test_commands_print_no_chatter_on_stderr_unless_verbose(tmp_path: Path, toy_model_dir: Path) -> None:
    """`search` and `stats` print their answer, not the encoder's start-up lines or a store caught up
    from SQL; the global `-v` brings those lines back (they are hidden, not lost)."""
    database_url = "sqlite:///" + str(tmp_path / "db.sqlite")
    env = cli_env(tmp_path / "data", database_url, toy_model_dir)
    folder = tmp_path / "photos"
    write_images(folder, 3)
    assert invoke(["index", str(folder), "-c", "photos"], env).exit_code == 0
    file = faiss_file(catalog_settings(tmp_path / "data", database_url), 1)
    stale = file.read_bytes()  # the store as a server that has not saved yet would leave it
    write_images(tmp_path / "more", 2, size=(20, 20))
    assert invoke(["index", str(tmp_path / "more"), "-c", "photos"], env).exit_code == 0

    delta_path(file).unlink(missing_ok=True)  # the second run's changes were appended to the log
    file.write_bytes(stale)
    quiet = run_cnclip(["stats"], env)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert quiet.stdout.splitlines()[1].split()[:4] == ["photos", "images", "5", "5"]
    delta_path(file).unlink(missing_ok=True)
    file.write_bytes(stale)
    loud = run_cnclip(["-v", "stats"], env)
    assert loud.returncode == 0 and "vector store caught up from SQL: 2 added" in loud.stderr

    found = run_cnclip(["search", "红色的花", "-c", "photos", "-k", "2"], env)
    assert found.returncode == 0 and found.stderr == "", found.stderr
    assert len(found.stdout.splitlines()) == 3  # two results and the summary line
    told = run_cnclip(["-v", "search", "红色的花", "-c", "photos", "-k", "2"], env)
    assert told.returncode == 0 and "ready in" in told.stderr and told.stdout == found.stdout


def test_dry_run_counts_exactly_what_the_real_run_embeds(
    tmp_path: Path, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A truncated JPEG (its header is fine, its pixels are not) fails the dry run as it fails the
    real run; after a full run the dry run has nothing to embed; the dry run never loads the model."""
    from retrieval.encoder import LocalEncoder
    from retrieval.preprocess import probe_image

    env = cli_env(tmp_path / "data", "sqlite:///" + str(tmp_path / "db.sqlite"), toy_model_dir)
    folder = tmp_path / "photos"
    write_images(folder, 3, size=(64, 64))
    whole = jpeg(99, (64, 64))
    truncated = folder / "cut.jpg"
    truncated.write_bytes(whole[: len(whole) * 2 // 3])
    (folder / "cut2.jpg").write_bytes(truncated.read_bytes())  # a copy: a duplicate, in both runs
    assert probe_image(truncated.read_bytes())[0] == "image/jpeg"  # the header alone passes
    dry_args = ["index", str(folder), "-c", "photos", "--dry-run", "--report", str(tmp_path / "dry.jsonl")]

    def no_model(self: LocalEncoder) -> None:
        raise AssertionError("a dry run loaded the model")

    with monkeypatch.context() as patch:
        patch.setattr(LocalEncoder, "start", no_model)
        before = invoke(dry_args, env)
    assert before.exit_code == 3, before.output  # like the real run: a file would fail
    assert "dry run: 3 images to embed, 0 to date, 0 unchanged, 1 duplicate," in before.output
    assert "1 unreadable" in before.output
    assert f"bad: {truncated}: the image data is corrupt or truncated" in before.output

    real = invoke(["index", str(folder), "-c", "photos"], env)
    assert real.exit_code == 3 and "indexed 3 new" in real.output and "failed 1" in real.output
    assert "duplicates 1" in real.output
    assert f"bad: {truncated}: the image data is corrupt or truncated" in real.output

    after = invoke(dry_args, env)
    assert "dry run: 0 images to embed, 0 to date, 3 unchanged, 1 duplicate," in after.output
    assert "1 unreadable" in after.output
    write_images(tmp_path / "one", 1, size=(40, 40))
    single = invoke(["index", str(tmp_path / "one"), "-c", "photos", "--dry-run"], env)
    assert single.exit_code == 0 and "dry run: 1 image to embed," in single.output


def test_reindex_checks_the_collection_first_and_says_why_it_rebuilt(tmp_path: Path, toy_model_dir: Path) -> None:
    env = cli_env(tmp_path / "data", "sqlite:///" + str(tmp_path / "db.sqlite"), toy_model_dir)
    missing = invoke(["reindex", "-c", "nope"], env)
    assert missing.exit_code == 1
    assert missing.output == "error: no collection named 'nope'\n"  # no progress bar drawn for it
    write_images(tmp_path / "photos", 3)
    assert invoke(["index", str(tmp_path / "photos"), "-c", "photos"], env).exit_code == 0
    rebuilt = invoke(["-v", "reindex", "-c", "photos"], env)
    assert rebuilt.exit_code == 0 and "photos: vector store rebuilt from SQL, 3 vectors" in rebuilt.stdout
    # The index file was there: the store is rebuilt because it was asked to be, and says so.
    assert "rebuilt from SQL (on request): 3 added" in rebuilt.stderr and "no index file" not in rebuilt.stderr


def test_manifest_items_have_paths_relative_to_the_manifest(tmp_path: Path, toy_model_dir: Path) -> None:
    """A manifest's files carry a `path` in the API like a folder's do (relative to the manifest's
    folder); a listed file outside that folder has none, and is served only through no symlink."""
    from api.searching import file_names

    database_url = "sqlite:///" + str(tmp_path / "db.sqlite")
    env = cli_env(tmp_path / "data", database_url, toy_model_dir)
    inside = write_images(tmp_path / "set" / "images", 2)
    outside = write_images(tmp_path / "elsewhere", 1, size=(20, 20))
    manifest = tmp_path / "set" / "list.jsonl"
    rows = [{"path": "images/0000.jpg"}, {"path": str(inside[1])}, {"path": str(outside[0])}]
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert invoke(["index", str(manifest), "-c", "photos"], env).exit_code == 0
    catalog = open_test_catalog(tmp_path / "data", database_url)
    try:
        items = catalog.get_many([int(i) for i in catalog.sql_ids("photos")])
        names = sorted(file_names(item) for item in items if item.root is not None)
        outside_rows = [item for item in items if item.root is None]
    finally:
        catalog.close()
    assert names == [("0000.jpg", "images/0000.jpg"), ("0001.jpg", "images/0001.jpg")]
    assert [file_names(item) for item in outside_rows] == [("0000.jpg", None)]
    assert [item.path for item in outside_rows] == [str(outside[0].resolve())]
