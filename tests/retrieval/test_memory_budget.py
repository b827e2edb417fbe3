"""The memory budget for the towers' weight copies (retrieval/memory_budget.py): `auto` by default,
what the tuner does within it (moves a tower off a copy-per-session backend, then drops prepacked
shapes) and what the runtime does with a tuning file's budget."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from api.config import Settings
from cli.main import build_cli
from retrieval.errors import InvalidInput
from retrieval.memory_budget import AUTO_EXTRA_MB, Budget, parse_budget, resolve_budget
from retrieval.toolchain.gate import Candidate
from retrieval.toolchain.tune.memory import fit_towers
from tests.support.tuning_files import start, tuning_for


def test_auto_is_the_default_and_means_one_copy_per_tower_plus_the_extra() -> None:
    assert Settings().memory_budget_mb == "auto"
    auto = resolve_budget("auto", 184.2)
    assert (auto.mb, auto.strict) == (185 + AUTO_EXTRA_MB, False)
    assert resolve_budget("auto", 184.2, tuned_mb=3000).mb == 3000  # a tuning file brings its own
    assert resolve_budget("auto", 184.2, tuned_mb=0).allows(10**9)  # tuned without a bound
    assert resolve_budget(700, 184.2, tuned_mb=3000) == Budget(700, True, "700 MB")  # explicit wins
    assert resolve_budget(0, 184.2).allows(10**9)


@pytest.mark.parametrize("text", ["-1", "1e3", "５", "auto!", "", "9" * 12])
def test_a_budget_that_is_not_auto_or_whole_megabytes_is_refused(text: str) -> None:
    with pytest.raises(InvalidInput, match="memory budget must be auto or a whole number"):
        parse_budget(text)
    assert parse_budget(" AUTO ") == "auto" and parse_budget("640") == 640


def test_cnclip_tune_refuses_a_bad_budget_in_one_line(toy_model_dir: Path) -> None:
    result = CliRunner().invoke(build_cli(), ["tune", "--model", str(toy_model_dir), "--memory-budget-mb", "lots"])
    assert result.exit_code == 2, result.output
    assert "--memory-budget-mb: the memory budget must be auto" in result.output and "Traceback" not in result.output


def _candidate(name: str, shares: bool) -> Candidate:
    backend = SimpleNamespace(name=name, shares_weights=lambda device: shares)
    return Candidate(backend, "cpu", "int8", "int8")


OWN, SHARED = _candidate("copies", shares=False), _candidate("sharing", shares=True)


def test_the_tuner_gives_up_the_least_speed_to_fit_the_budget() -> None:
    # Each tower: a copy-per-session backend (3 shapes × 100 MB) fastest, a sharing one (100 MB) slower:
    # the image tower loses 1.3× by sharing, the text tower 1.8×.
    ranked = {"image": [(1.0, OWN), (1.3, SHARED)], "text": [(1.0, OWN), (1.8, SHARED)]}

    def fit(mb: int) -> tuple[dict[str, str], list[str]]:
        need = lambda tower, c: 300.0 if c is OWN else 100.0  # noqa: E731  # what their sessions took
        picked, notes = fit_towers(ranked, need, Budget(mb, False, "auto"))
        return {t: c.backend.name for t, c in picked.items()}, notes

    assert fit(600) == ({"image": "copies", "text": "copies"}, [])
    picked, notes = fit(599)  # one tower must share: the image tower, which loses less
    assert picked == {"image": "sharing", "text": "copies"}
    assert notes == [
        "copies cpu int8 image: its sessions took 300 MB here, over the memory budget (auto) "
        "beside the other tower; sharing cpu int8 instead (100 MB, 1.30× the fastest)"
    ]
    assert fit(400)[0] == {"image": "sharing", "text": "copies"}
    assert fit(399)[0] == {"image": "sharing", "text": "sharing"}
    assert fit(50)[0] == {"image": "sharing", "text": "sharing"}  # nothing fits: the least memory
    assert fit(0)[0] == {"image": "copies", "text": "copies"}  # 0: no bound


def test_auto_at_start_keeps_within_the_tuning_files_budget_and_never_refuses(
    toy_model_dir: Path, tmp_path: Path, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    text = {
        "precision": "fp32",
        "shapes": {"b1": {"prepack": True, "prepack_gain": 2.0}, "b4": {"prepack": True, "prepack_gain": 1.1}},
    }
    path = tmp_path / "t.json"
    for tuned_mb, prepacked in ((3, {(1, None)}), (0, {(1, None), (4, None)})):
        path.write_text(json.dumps({**tuning_for(toy_model_dir, text=text), "memory_budget_mb": tuned_mb}))
        encoder = start(settings.model_copy(update={"tuning_file": path, "memory_budget_mb": "auto"}))
        assert encoder.plans["text"].prepack == prepacked
    # A budget the shared copies alone exceed: under auto, a line and the plan without prepacking.
    path.write_text(json.dumps({**tuning_for(toy_model_dir, text=text), "memory_budget_mb": 1}))
    with caplog.at_level(logging.INFO, logger="retrieval.tower_plan"):
        encoder = start(settings.model_copy(update={"tuning_file": path, "memory_budget_mb": "auto"}))
    assert encoder.plans["text"].prepack == frozenset()
    assert "over the memory budget (the tuning file's 1 MB)" in caplog.text


def test_prepacked_shapes_are_dropped_counting_a_session_per_shape_where_the_backend_cannot_share() -> None:
    from retrieval.toolchain.tune.memory import TowerMemory, fit_prepacks
    from retrieval.tuning import ShapeChoice, TowerChoice

    def tower(backend: str, gains: dict[str, float]) -> TowerChoice:
        shapes = {k: ShapeChoice(prepack=g > 1, ms=1.0, prepack_gain=g) for k, g in gains.items()}
        return TowerChoice(backend=backend, device="cpu", precision="int8", shapes=shapes)

    choices = {
        "image": tower("openvino", {"b1": 1.0, "b8": 1.0, "b16": 1.0}),  # three own copies, nothing to drop
        "text": tower("onnxruntime", {"b1": 1.5, "b1.l16": 1.2, "b16": 1.0}),
    }
    memory = {"image": TowerMemory(False, 0.0, 100.0), "text": TowerMemory(True, 100.0, 100.0)}
    fitted = fit_prepacks(choices, memory, Budget(500, False, "auto"))
    # 300 (image) + the shared text copy 100 + one prepacked copy 100: the smaller gain went.
    assert {k for k, v in fitted["text"].shapes.items() if v.prepack} == {"b1"}


_MEASURE = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
import numpy as np
from retrieval.toolchain.gate import Candidate
from retrieval.manifest import ModelManifest
from retrieval.toolchain.tune.tuner import TuneOptions, candidates, measure

class Heavy:
    def __init__(self, *args):
        self.ballast = np.ones(40 << 20, dtype=np.uint8)  # 40 MB, every page touched

    def run(self, batch):
        return batch

manifest = ModelManifest.load(Path(sys.argv[1]))
found, _ = candidates(manifest, ["onnxruntime"])
heavy = SimpleNamespace(name="heavy", shares_weights=lambda device: False, open_session=Heavy)
found["text"].append(Candidate(heavy, "cpu", "fp32", "fp32"))
memory = measure(manifest, found, TuneOptions(rounds=1, seconds=0.01), lambda *_: None).memory
print(json.dumps({f"{tower} {label}": mb for (tower, label), mb in memory.items()}))
"""


def test_the_tuner_measures_what_each_configurations_sessions_take(tmp_path: Path) -> None:
    """Each configuration is charged the resident memory its sessions took: a fake backend whose
    sessions hold 40 MB each (touched) is charged ~40 MB per shape, the real ones far less. In a
    fresh process, as `cnclip tune` runs: the suite's own garbage would be freed mid-measurement."""
    import subprocess
    import sys

    from retrieval.toolchain.toy_model import write_toy_model

    write_toy_model(tmp_path / "m", buckets=(1, 4), text_lengths=(16,))
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(tmp_path / "m")], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    memory = json.loads(done.stdout)
    shapes = 4  # b1, b4 × 16 and 52 tokens
    assert 0.9 * 40 * shapes <= memory["text heavy cpu fp32 own"] <= 1.2 * 40 * shapes, memory
    assert all(mb < 40 for label, mb in memory.items() if "heavy" not in label), memory
