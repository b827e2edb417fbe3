"""`cnclip index` says where its time went: a stage line in its summary and `stages` in `--json`."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import build_cli
from tests.support.indexer_helpers import cli_env, write_images

STAGES = {"walk_s", "read_s", "decode_s", "core_wait_s", "encode_s", "commit_s", "vectors_s", "ocr_s", "wall_s"}


def test_json_has_every_stage_and_the_rate_of_the_run(tmp_path: Path, toy_model_dir: Path) -> None:
    env = cli_env(tmp_path / "data", "sqlite:///" + str(tmp_path / "db.sqlite"), toy_model_dir)
    write_images(tmp_path / "photos", 12, size=(96, 64))
    started = time.perf_counter()
    result = CliRunner().invoke(build_cli(), ["index", str(tmp_path / "photos"), "-c", "photos", "--json"], env=env)
    outside = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    line = json.loads(result.output.strip().splitlines()[-1])

    stages = line["stages"]
    assert set(stages) == STAGES
    assert all(isinstance(seconds, float | int) and seconds >= 0 for seconds in stages.values())
    # The local encoder was handed pixels the reader threads decoded: both stages did work.
    assert stages["decode_s"] > 0 and stages["encode_s"] > 0 and stages["read_s"] > 0 and stages["commit_s"] > 0
    assert stages["wall_s"] == pytest.approx(line["seconds"], abs=0.001)  # the run's wall, as `seconds`
    assert 0 < stages["wall_s"] <= outside  # inside the command's own time (which also opens the model)
    # `seconds` is rounded to the millisecond, the rate is not: a 44 ms run's rate lies within that rounding.
    slowest, fastest = 12 / (line["seconds"] + 0.0005), 12 / max(line["seconds"] - 0.0005, 1e-9)
    assert slowest - 0.01 <= line["images_per_s"] <= fastest + 0.01


def test_the_summary_shows_the_stages_after_a_run_that_embedded(tmp_path: Path, toy_model_dir: Path) -> None:
    env = cli_env(tmp_path / "data", "sqlite:///" + str(tmp_path / "db.sqlite"), toy_model_dir)
    write_images(tmp_path / "photos", 5, size=(64, 48))
    first = CliRunner().invoke(build_cli(), ["index", str(tmp_path / "photos"), "-c", "photos"], env=env)
    assert first.exit_code == 0, first.output
    shown = re.search(
        r"stages \(s, overlapping\): walk [\d.]+, read [\d.]+, decode [\d.]+.*wall ([\d.]+)", first.output
    )
    assert shown is not None, first.output
    assert "encode" in shown.group(0) and "commit" in shown.group(0) and "vectors" in shown.group(0)

    again = CliRunner().invoke(build_cli(), ["index", str(tmp_path / "photos"), "-c", "photos"], env=env)
    assert again.exit_code == 0 and "unchanged 5" in again.output
    assert "stages" not in again.output  # nothing embedded: no stages to read (like the rate)
