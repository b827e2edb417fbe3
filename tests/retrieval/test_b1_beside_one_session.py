"""A static prepacked batch-1 session beside ONNX Runtime's one shape-dynamic session (issue 34).

On an AVX2 EPYC the one session ran image batch 1 in 181–212 ms against 133–145 ms for a static
batch-1 session with its own prepacked copy, while winning at b16 and for every text shape; the tuner
chose between "one session" and "a session per shape" for the whole tower, kept the one session, and
left image b1 at 1.36× the fastest configuration (BENCHMARKS.md). Now a batch-1 image shape that runs
PREPACK_GAIN faster on its own prepacked session runs there, beside the one session, which still
takes every other size unpadded; the memory budget counts and drops that copy first; `serve` runs it
as the file says, and the tuner's validation over HTTP compares it with the defaults."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from api.config import Settings
from retrieval.backends import ONNXRUNTIME, DeviceChoice, SessionConfig
from retrieval.encoder import LocalEncoder
from retrieval.manifest import ModelManifest
from retrieval.memory_budget import Budget
from retrieval.sessions import BucketedSession
from retrieval.shared_weights import SharedWeights
from retrieval.toolchain.gate import Candidate
from retrieval.toolchain.toy_model import write_toy_model
from retrieval.toolchain.tune import validate as validation
from retrieval.toolchain.tune.memory import TowerMemory, fit_prepacks
from retrieval.toolchain.tune.ranking import PREPACK_GAIN, one_session, shape_choices
from retrieval.toolchain.tune.report import table
from retrieval.toolchain.tune.tuner import TuneResult
from retrieval.tower_plan import TowerPlan, plan_bytes
from retrieval.tuning import Measurement, Shape, ShapeChoice, TowerChoice, TuningFile
from tests.support.model_inputs import varied_input
from tests.support.tuning_files import tuning_for

DEMO = Path(__file__).resolve().parents[2] / "models" / "cnclip-demo"
ORT = Candidate(SimpleNamespace(name="onnxruntime"), "cpu", "int8", "int8")
IMAGE: list[Shape] = [(1, None), (8, None), (16, None)]
TEXT: list[Shape] = [(1, 16), (8, 16), (16, 16)]


def _samples(tower: str, shapes: list[Shape], dynamic_b1: float) -> dict[tuple[str, Shape, str], list[float]]:
    """The AVX2 EPYC's image times, ms: prepacked per shape 140 at b1 and 1000/2000 at b8/b16; shared
    slower; the one session `dynamic_b1` at b1 and a little faster than prepacked when batched."""
    per_shape = {1: (170.0, 140.0, dynamic_b1), 8: (1200.0, 1000.0, 950.0), 16: (2400.0, 2000.0, 1900.0)}
    out = {}
    for shape in shapes:
        for mode, ms in zip(("shared", "prepacked", "dynamic"), per_shape[shape[0]], strict=True):
            out[tower, shape, f"{ORT.label} {mode}"] = [ms, ms * 1.02]
    return out


def test_an_image_b1_shape_faster_on_its_own_session_runs_there_beside_the_one_session() -> None:
    samples = _samples("image", IMAGE, dynamic_b1=190.0)
    one = one_session("image", ORT, samples, shape_choices("image", ORT, samples, IMAGE))
    assert one is not None
    assert (one[1, None].prepack, one[1, None].ms, one[1, None].prepack_gain) == (True, 140.0, round(190 / 140, 3))
    assert [(one[s].prepack, one[s].ms) for s in IMAGE[1:]] == [(False, 950.0), (False, 1900.0)]
    # Below PREPACK_GAIN the one session keeps batch 1 too (no second copy for a small gain).
    samples = _samples("image", IMAGE, dynamic_b1=140.0 * (PREPACK_GAIN - 0.01))
    one = one_session("image", ORT, samples, shape_choices("image", ORT, samples, IMAGE))
    assert one is not None and not any(c.prepack for c in one.values())


def test_text_keeps_every_shape_on_the_one_session() -> None:
    # The one session runs text at its batch's own width: a static b1 text session would get only its
    # exact width. The same times as the image case above: nothing beside the one session.
    samples = _samples("text", TEXT, dynamic_b1=190.0)
    one = one_session("text", ORT, samples, shape_choices("text", ORT, samples, TEXT))
    assert one is not None and not any(c.prepack for c in one.values())


def test_the_budget_drops_the_copy_beside_the_one_session_before_the_one_session() -> None:
    shapes = {"b1": ShapeChoice(prepack=True, ms=140.0, prepack_gain=1.36), "b8": ShapeChoice(prepack=False)}
    hybrid = TowerChoice(backend="onnxruntime", device="cpu", precision="int8", shapes=shapes, dynamic=True)
    per_shape = hybrid.model_copy(update={"dynamic": False})
    memory = {"image": TowerMemory(True, shared_mb=100.0, per_shape_mb=100.0, dynamic_mb=150.0)}
    # 150 + 100 MB fit 250: kept as chosen.
    kept = fit_prepacks({"image": hybrid}, memory, Budget(250, False, "auto"), {"image": per_shape})["image"]
    assert kept.dynamic and kept.prepacked() == {(1, None)}
    # Not in 200: the b1 copy goes, the one session stays (not its per-shape sessions: shared + b1 = 200).
    fitted = fit_prepacks({"image": hybrid}, memory, Budget(200, False, "auto"), {"image": per_shape})["image"]
    assert fitted.dynamic and not fitted.prepacked()
    assert "one shape-dynamic session and prepacked b1" in hybrid.words()


def test_serve_counts_the_copy_beside_the_one_session_against_the_budget() -> None:
    plan = TowerPlan(
        tower="image",
        backend=ONNXRUNTIME,
        device=DeviceChoice("cpu", "test"),
        precision="int8",
        graph="int8",
        buckets=[1, 8, 16],
        share=True,
        prepack=frozenset({(1, None)}),
        streams=2,
        dynamic=True,
    )
    assert plan_bytes(plan, shapes=3, copy_bytes=100) == 400  # per stream: the one session's copy + b1's
    assert "beside it, its own prepacked copy for b1" in plan.weights_words()


def test_batch_1_runs_on_its_own_session_and_every_other_size_on_the_one_session_unpadded() -> None:
    manifest = ModelManifest.load(DEMO)
    config = SessionConfig(provider="cpu", precision="int8", cores=[0], weights=SharedWeights("t"), dynamic_shapes=True)
    buckets = manifest.towers["image"].buckets("int8")
    bucketed = BucketedSession.open(manifest, "image", "int8", buckets, config, prepack={(1, None)})
    batch1 = varied_input("image", 1, 52, seed=1)
    own = bucketed.sessions[1, None]
    assert own._graphs is None  # type: ignore[attr-defined]  # a static session of its own
    dynamic = {id(s._graphs.session_for(s._path)) for k, s in bucketed.sessions.items() if k[0] > 1}  # type: ignore[attr-defined]
    assert len(dynamic) == 1  # every other bucket on one session
    # The one session spans batch 1 too (the b1 graph joined it): any size up to the largest bucket.
    assert bucketed.any_batch_up_to() == max(buckets)
    bucketed.any_batch = bucketed.any_batch_up_to()
    reference = BucketedSession.open(manifest, "image", "int8", [1], SessionConfig("cpu", "int8", cores=[0]))
    assert np.abs(bucketed.run(batch1) - reference.run(batch1)).max() < 1e-5
    five = varied_input("image", 5, 52, seed=2)
    assert bucketed.run(five).shape[0] == 5  # no bucket of 5: unpadded on the one session


def test_serve_runs_the_file_as_written_with_the_same_vectors(tmp_path: Path, settings: Settings) -> None:
    model = tmp_path / "model"
    write_toy_model(model, buckets=(1, 4, 8))
    image = {"precision": "int8", "dynamic": True, "shapes": {"b1": {"prepack": True, "prepack_gain": 1.36}}}
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps(tuning_for(model, image=image)))
    pixels = varied_input("image", 3, 52, seed=5)

    async def vectors(tuning_file: Path) -> tuple[LocalEncoder, bool, np.ndarray, np.ndarray]:
        encoder = LocalEncoder(
            settings.model_copy(update={"model_dir": model, "buckets": [1, 4, 8], "tuning_file": tuning_file})
        )
        await encoder.start()
        try:
            b1 = encoder._pools["image"].streams[0].session.sessions[1, None]  # noqa: SLF001
            own = b1._graphs is None  # type: ignore[attr-defined]  # not on the stream's one session
            one = await encoder.embed_pixels(pixels[:1])
            three = await encoder.embed_pixels(pixels)
        finally:
            await encoder.close()
        return encoder, own, one, three

    tuned, own, one, three = asyncio.run(vectors(path))
    plan = tuned.plans["image"]
    assert (plan.source, plan.dynamic, plan.prepack, own) == ("tuning file", True, frozenset({(1, None)}), True)
    _, default_own, default_one, default_three = asyncio.run(vectors(tmp_path / "absent.json"))
    assert not default_own
    assert np.abs(one - default_one).max() < 1e-4 and np.abs(three - default_three).max() < 1e-4


def test_the_tuner_validates_it_over_http_against_the_defaults(
    toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not the defaults (they run no b1 copy), so the tuner measures it through a `cnclip worker` over
    HTTP beside a worker on the defaults; the tuned worker planned the tower from the file."""
    served: list[tuple[bool, int]] = []
    real = validation.served_rate

    def served_rate(worker, load, concurrency, seconds):  # type: ignore[no-untyped-def]
        rate = real(worker, load, concurrency, 0.05)
        assert rate > 0  # really answered over HTTP
        served.append(("tuning file" in worker.plan_sources().values(), concurrency))
        return rate

    monkeypatch.setattr(validation, "served_rate", served_rate)
    image = {"precision": "int8", "dynamic": True, "shapes": {"b1": {"prepack": True, "prepack_gain": 1.36}}}
    text = {"precision": "int8", "dynamic": True}
    tuning = TuningFile.model_validate(tuning_for(toy_model_dir, image=image, text=text))
    manifest = ModelManifest.load(toy_model_dir)
    _checked, points, _kept, _mb = validation.validate(toy_model_dir, manifest, tuning, 0.01, lambda *_: None)
    assert {p.tower for p in points} == {"image"}  # text is the defaults: nothing to compare
    assert {(tuned, c) for tuned, c in served if c > 1} == {(True, 8), (False, 8)}


def test_tunes_table_marks_b1_prepacked_and_the_other_shapes_on_the_one_session(toy_model_dir: Path) -> None:
    image = {"dynamic": True, "shapes": {"b1": {"prepack": True, "prepack_gain": 1.36}, "b8": {"prepack": False}}}
    tuning = TuningFile.model_validate(tuning_for(toy_model_dir, image=image, text={"dynamic": True}))
    measurements = [
        Measurement(
            tower="image",
            shape=shape,
            backend="onnxruntime",
            device="cpu",
            precision="int8",
            weights=weights,
            ms=ms,
            ms_min=ms,
            ms_max=ms,
        )
        for shape, weights, ms in [
            ("b1", "dynamic", 190.0),
            ("b1", "prepacked", 140.0),
            ("b8", "dynamic", 950.0),
            ("b8", "prepacked", 1000.0),
        ]  # fmt: skip
    ]
    tuning = tuning.model_copy(update={"measurements": measurements})
    rows = table(TuneResult(tuning, [], [], {}))[2:]
    chosen = {(row.split("|")[2].strip(), row.split("|")[6].strip()) for row in rows if "**yes**" in row}
    assert chosen == {("b1", "prepacked"), ("b8", "dynamic")}
