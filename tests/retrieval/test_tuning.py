"""`cnclip tune` and the tuning file: its output, the file it writes, and its use by the encoder and
`cnclip serve` — and the refusals: another machine, another model, a corrupt or hostile file."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from api.config import Settings
from cli.main import build_cli
from retrieval.backends.openvino import OpenVinoSession
from retrieval.encoder import LocalEncoder
from retrieval.errors import InvalidInput, ModelError
from retrieval.manifest import ModelManifest
from retrieval.toolchain.toy_model import write_toy_model
from retrieval.tuning import (
    MAX_BYTES,
    TUNING_NAME,
    TuningFile,
    machine_fingerprint,
    read_tuning,
    write_tuning,
)
from tests.support.cli_server import CliServer, env_for
from tests.support.kserve_server import free_port
from tests.support.tuning_files import start, tuning_for


@pytest.fixture(scope="module")
def tuned_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A toy model (buckets 1 and 4, a 16-token text length) tuned by the real command, tiny."""
    model = tmp_path_factory.mktemp("tuned") / "model"
    write_toy_model(model, buckets=(1, 4), text_lengths=(16,))
    result = CliRunner().invoke(
        build_cli(),
        # --accept-noise: what these tests check (the file, its use) holds on a busy test machine too.
        ["tune", "--model", str(model), "--seconds", "0.02", "--validate-seconds", "0.1", "--accept-noise"],
        catch_exceptions=False,
    )
    return model, result


def test_tune_prints_the_table_and_the_choice_and_writes_the_file(tuned_model: tuple[Path, Any]) -> None:
    model, result = tuned_model
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "| tower | shape | backend | device | precision | weights | ms (min–max) | × shipped | chosen |"
    rows = [line.split(" | ") for line in lines[2:] if line.startswith("| ")]
    # Every tower × shape × (ORT int8/fp32 shared/prepacked, OpenVINO fp32 [+ bf16]): all measured.
    assert {(r[0][2:], r[1]) for r in rows} == {
        ("image", "b1"),
        ("image", "b4"),
        *(("text", s) for s in ("b1", "b4", "b1.l16", "b4.l16")),
    }
    assert {
        ("onnxruntime", "int8", "shared"),
        ("onnxruntime", "int8", "prepacked"),
        ("onnxruntime", "int8", "dynamic"),  # the one shape-dynamic session `serve` runs by default
        ("openvino", "fp32", "own"),
    } <= {(r[2], r[4], r[5]) for r in rows}
    chosen = [r for r in rows if r[-1].startswith("**yes**")]
    assert len(chosen) == 6  # one chosen configuration per tower and shape
    assert any(line.startswith("gate: text on onnxruntime int8: min cosine") for line in lines)
    assert any(line.startswith("chosen: image → ") for line in lines)
    assert lines[-1] == f"wrote {model / TUNING_NAME}"
    tuning = TuningFile.model_validate_json((model / TUNING_NAME).read_text())
    assert tuning.fingerprint.model_dump() == machine_fingerprint()
    assert tuning.model_id == ModelManifest.load(model).model_id
    assert set(tuning.towers["text"].shapes) == {"b1", "b4", "b1.l16", "b4.l16"}
    assert len(tuning.measurements) == len(rows) and all(g["passed"] for g in tuning.gate)


def test_the_encoder_uses_a_matching_tuning_file(tuned_model: tuple[Path, Any], settings: Settings, caplog) -> None:
    model, _ = tuned_model
    caplog.set_level(logging.INFO, logger="retrieval")
    encoder = start(settings.model_copy(update={"model_dir": model, "buckets": [1, 4]}))
    tuning = TuningFile.model_validate_json((model / TUNING_NAME).read_text())
    assert any(r.getMessage().startswith(f"using tuning file {model / TUNING_NAME}") for r in caplog.records)
    for tower, plan in encoder.plans.items():
        choice = tuning.towers[tower]  # type: ignore[index]
        assert (plan.backend.name, plan.precision, plan.source) == (choice.backend, choice.precision, "tuning file")
        assert plan.prepack == choice.prepacked()
        assert plan.dynamic == (choice.dynamic is True)  # ONNX Runtime: as measured; OpenVINO: never


def test_a_tuned_choice_opens_those_sessions(settings: Settings, tmp_path: Path, caplog) -> None:
    model = tmp_path / "model"
    write_toy_model(model, buckets=(1, 4))
    text = {"precision": "fp32", "shapes": {"b1": {"prepack": True, "prepack_gain": 1.4}, "b4": {"prepack": False}}}
    image = {"backend": "openvino", "device": "CPU", "precision": "fp32"}
    (model / TUNING_NAME).write_text(json.dumps(tuning_for(model, text=text, image=image)))
    caplog.set_level(logging.INFO, logger="retrieval")

    async def main() -> dict[str, Any]:
        encoder = LocalEncoder(settings.model_copy(update={"model_dir": model, "buckets": [1, 4]}))
        await encoder.start()
        sessions = {t: encoder._pools[t].streams[0].session.sessions for t in ("image", "text")}
        await encoder.close()
        return sessions

    sessions = asyncio.run(main())
    assert all(isinstance(s, OpenVinoSession) for s in sessions["image"].values())
    assert sessions["text"][(1, None)].weights is None  # its own prepacked copy
    assert sessions["text"][(4, None)].weights is not None  # the shared one
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("text tower:"))
    assert "its own prepacked copy for b1 (tuned)" in line and "[tuning file]" in line
    assert any(r.getMessage().startswith("image tower: openvino CPU") for r in caplog.records)


def test_serve_logs_that_it_uses_the_tuning_file(tuned_model: tuple[Path, Any], tmp_path: Path) -> None:
    model, _ = tuned_model
    port = free_port()
    env = env_for(model, tmp_path)
    env.update(CNCLIP_BUCKETS="[1,4]", CNCLIP_PRECISION="auto")
    serve = CliServer(["serve", "--port", str(port)], env, tmp_path / "serve.log")
    try:
        serve.start()
        output = serve.output()
        assert f"using tuning file {model / TUNING_NAME}" in output
        assert "[tuning file]" in output and "ready in" in output
    finally:
        serve.stop()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\x00\xff not json", "refused"),
        (b"{}", "refused (format: Field required)"),
        (b"[1, 2]", "refused"),
        (b"[" * 5000 + b"]" * 5000, "refused (nested too deeply"),  # past Python's parser: not a RecursionError
        (None, "refused (towers.text.backend"),  # a hostile backend name
        (b" " * (MAX_BYTES + 1), "refused (larger than 4 MiB)"),
    ],
)
def test_a_corrupt_or_hostile_tuning_file_is_refused_in_one_line(
    content: bytes | None, reason: str, toy_model_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / TUNING_NAME
    if content is None:
        data = tuning_for(toy_model_dir, text={"backend": "../../etc/passwd"})
        content = json.dumps(data).encode()
    path.write_bytes(content)
    model_id = ModelManifest.load(toy_model_dir).model_id
    outcome = read_tuning(path, model_id, toy_model_dir)
    assert outcome.tuning is None and outcome.level == logging.WARNING
    assert outcome.line.startswith(f"tuning file {path} {reason}") and "\n" not in outcome.line
    assert "cnclip tune --model" in outcome.line


def test_unknown_fields_and_bad_shapes_are_refused(toy_model_dir: Path, tmp_path: Path) -> None:
    model_id = ModelManifest.load(toy_model_dir).model_id
    for change, words in (
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
        ({"towers": {"image": {"backend": "onnxruntime", "device": "cpu", "precision": "int4"}}}, "precision"),
    ):
        data = {**tuning_for(toy_model_dir), **change}
        (tmp_path / "t.json").write_text(json.dumps(data))
        assert words in read_tuning(tmp_path / "t.json", model_id, toy_model_dir).line
    data = tuning_for(toy_model_dir, text={"shapes": {"b1;rm -rf": {"prepack": True}}})
    (tmp_path / "t.json").write_text(json.dumps(data))
    assert "is not bN or bN.lM" in read_tuning(tmp_path / "t.json", model_id, toy_model_dir).line


def test_a_tuning_file_from_another_machine_or_model_falls_back(
    toy_model_dir: Path, tmp_path: Path, settings: Settings, caplog
) -> None:
    data = tuning_for(toy_model_dir, text={"precision": "fp32"})
    data["fingerprint"]["cores"] += 8
    data["fingerprint"]["flags"] = ["avx2", "amx_int8"]
    path = tmp_path / "other.json"
    path.write_text(json.dumps(data))
    caplog.set_level(logging.INFO, logger="retrieval")
    encoder = start(settings.model_copy(update={"tuning_file": path}))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "made on another machine" in warnings[0] and "cores there" in warnings[0]
    assert "run `cnclip tune --model" in warnings[0]
    assert encoder.plans["text"].precision == "int8" and encoder.plans["text"].source == "defaults"
    data = tuning_for(toy_model_dir)
    data["model_id"] = "someone-else@000000000000"
    path.write_text(json.dumps(data))
    outcome = read_tuning(path, ModelManifest.load(toy_model_dir).model_id, toy_model_dir)
    assert outcome.tuning is None and "made for model someone-else" in outcome.line


def test_a_tuned_backend_that_is_gone_falls_back(
    toy_model_dir: Path, tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    import sys

    from retrieval.backends import openvino as ov_backend

    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(tuning_for(toy_model_dir, image={"backend": "openvino", "device": "CPU", "precision": "fp32"}))
    )
    monkeypatch.setitem(sys.modules, "openvino", None)
    ov_backend._core.cache_clear()
    caplog.set_level(logging.WARNING, logger="retrieval")
    try:
        encoder = start(settings.model_copy(update={"tuning_file": path}))
    finally:
        ov_backend._core.cache_clear()
    assert encoder.plans["image"].backend.name == "onnxruntime"
    # Its engine is part of the fingerprint: the file is for another machine now.
    assert any("openvino 2026" in r.getMessage() and "absent here" in r.getMessage() for r in caplog.records)
    # A file that did not record the engine (hand-written) still cannot make the tower fail: that tower
    # falls back alone, with one line.
    data = tuning_for(toy_model_dir, image={"backend": "openvino", "device": "CPU", "precision": "fp32"})
    data["fingerprint"]["engines"].pop("openvino", None)
    path.write_text(json.dumps(data))
    caplog.clear()
    monkeypatch.setitem(sys.modules, "openvino", None)
    ov_backend._core.cache_clear()
    try:
        encoder = start(settings.model_copy(update={"tuning_file": path}))
    finally:
        ov_backend._core.cache_clear()
    assert encoder.plans["image"].backend.name == "onnxruntime" and encoder.plans["text"].source == "tuning file"
    assert [r.getMessage() for r in caplog.records if "cannot be used" in r.getMessage()] == [
        "tuning file: image's choice cannot be used (backend openvino is not usable here: openvino is not "
        "installed (pip install 'cnclip-search[openvino]'): import of openvino halted; None in sys.modules); "
        "the defaults run it"
    ]


def test_a_read_only_place_is_a_clear_error(toy_model_dir: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    tuning = TuningFile.model_validate(tuning_for(toy_model_dir))
    with pytest.raises(InvalidInput, match="cannot write the tuning file .*pass --out FILE .*CNCLIP_TUNING_FILE"):
        write_tuning(blocker / TUNING_NAME, tuning)
    assert write_tuning(tmp_path / "ok.json", tuning).read_text().startswith("{")
    assert not list(tmp_path.glob(".*tmp*"))


def test_the_memory_budget_drops_prepacked_shapes_then_refuses(
    toy_model_dir: Path, tmp_path: Path, settings: Settings
) -> None:
    text = {
        "precision": "fp32",
        "shapes": {"b1": {"prepack": True, "prepack_gain": 2.0}, "b4": {"prepack": True, "prepack_gain": 1.1}},
    }
    path = tmp_path / "t.json"
    path.write_text(json.dumps(tuning_for(toy_model_dir, text=text)))
    # The toy's fp32 text weights are 1.3 MiB: shared + b1 fits 3 MB, shared + b1 + b4 (3.9) does not.
    encoder = start(settings.model_copy(update={"tuning_file": path, "memory_budget_mb": 3}))
    assert encoder.plans["text"].prepack == {(1, None)}  # the smaller gain went first
    with pytest.raises(ModelError, match="CNCLIP_MEMORY_BUDGET_MB=1 but the towers' weights need"):
        start(settings.model_copy(update={"tuning_file": path, "memory_budget_mb": 1}))


def test_latency_prepacks_batched_shapes_only_at_a_larger_gain_throughput_every_shape_that_gains() -> None:
    from types import SimpleNamespace

    from retrieval.toolchain.gate import Candidate
    from retrieval.toolchain.tune.ranking import BATCHED_PREPACK_GAIN, PREPACK_GAIN, shape_choices
    from retrieval.tuning import Shape

    ort = Candidate(SimpleNamespace(name="onnxruntime"), "cpu", "int8", "int8")
    gains: dict[Shape, float] = {  # shared ms ÷ prepacked ms
        (1, 16): PREPACK_GAIN + 0.01,  # batch 1: the small gain is enough for both objectives
        (8, 16): BATCHED_PREPACK_GAIN + 0.01,  # batched, a large gain (issue 34's 1.3–3.9×): latency too
        (16, 16): BATCHED_PREPACK_GAIN - 0.05,  # batched, a smaller gain: throughput only
        (4, 16): PREPACK_GAIN - 0.02,  # too small for either
    }
    samples: dict[tuple[str, Shape, str], list[float]] = {}
    for shape, gain in gains.items():
        samples["text", shape, f"{ort.label} shared"] = [10.0 * gain] * 3
        samples["text", shape, f"{ort.label} prepacked"] = [10.0] * 3
    for objective, packed in (
        ("latency", {(1, 16), (8, 16)}),
        ("throughput", {(1, 16), (8, 16), (16, 16)}),
    ):
        chosen = shape_choices("text", ort, samples, list(gains), objective)
        assert {s for s, c in chosen.items() if c.prepack} == packed, objective
        assert chosen[16, 16].prepack_gain == round(BATCHED_PREPACK_GAIN - 0.05, 3)  # measured either way
        # The time of what runs: shared where the gain was too small to keep (the one-session
        # comparison reads it: a per-shape choice is not credited with a prepacking it does not do).
        shared_ms = round(10.0 * (BATCHED_PREPACK_GAIN - 0.05), 3)
        assert chosen[16, 16].ms == (10.0 if objective == "throughput" else shared_ms), objective
