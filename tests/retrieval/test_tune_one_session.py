"""`cnclip tune` measures the one shape-dynamic session per stream that `serve` runs by default on
ONNX Runtime's CPU, chooses it unless sessions per shape are faster, and `serve` runs what it chose.

Before, the tuner compared only sessions per shape (shared or prepacked) and its choice lost to the
defaults' one session over HTTP by 1.3–1.5× (issue 34, BENCHMARKS.md): the fastest configuration
allowed was never among those it measured."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from api.config import Settings
from retrieval.memory_budget import Budget
from retrieval.toolchain.gate import Candidate
from retrieval.toolchain.toy_model import write_toy_model
from retrieval.toolchain.tune.memory import TowerMemory, fit_prepacks
from retrieval.toolchain.tune.ranking import PREPACK_GAIN, one_session, shape_choices
from retrieval.toolchain.tune.validate import default_choice, same_as_default
from retrieval.tuning import Shape, ShapeChoice, TowerChoice
from tests.support.tuning_files import start, tuning_for

ORT = Candidate(SimpleNamespace(name="onnxruntime"), "cpu", "int8", "int8")
SHAPES: list[Shape] = [(1, 16), (8, 16), (16, 16)]


def _samples(shared: float, prepacked: float, dynamic: float | None) -> dict[tuple[str, Shape, str], list[float]]:
    out = {}
    for shape in SHAPES:
        out["text", shape, f"{ORT.label} shared"] = [shared * shape[0]] * 3
        out["text", shape, f"{ORT.label} prepacked"] = [prepacked * shape[0]] * 3
        if dynamic is not None:
            out["text", shape, f"{ORT.label} dynamic"] = [dynamic * shape[0]] * 3
    return out


def test_the_one_session_is_chosen_unless_sessions_per_shape_beat_it_by_the_prepack_gain() -> None:
    # Prepacking gains 2× per shape; the one session is as fast as the prepacked sessions: it wins,
    # and the shapes record its times (nothing "prepacked" on their own).
    samples = _samples(shared=10.0, prepacked=5.0, dynamic=5.0)
    per_shape = shape_choices("text", ORT, samples, SHAPES)
    one = one_session("text", ORT, samples, per_shape)
    assert one is not None and {s: c.ms for s, c in one.items()} == {s: 5.0 * s[0] for s in SHAPES}
    assert not any(c.prepack for c in one.values())
    # A little slower than the sessions per shape, within PREPACK_GAIN: still the one session.
    samples = _samples(shared=10.0, prepacked=5.0, dynamic=5.0 * (PREPACK_GAIN - 0.01))
    assert one_session("text", ORT, samples, shape_choices("text", ORT, samples, SHAPES)) is not None
    # Slower by more than that: the sessions per shape.
    samples = _samples(shared=10.0, prepacked=5.0, dynamic=5.0 * (PREPACK_GAIN + 0.05))
    assert one_session("text", ORT, samples, shape_choices("text", ORT, samples, SHAPES)) is None
    # Not measured (a backend without it): nothing to choose.
    samples = _samples(shared=10.0, prepacked=5.0, dynamic=None)
    assert one_session("text", ORT, samples, shape_choices("text", ORT, samples, SHAPES)) is None


def test_a_one_session_choice_over_the_budget_goes_to_its_sessions_per_shape() -> None:
    per_shape = TowerChoice(
        backend="onnxruntime",
        device="cpu",
        precision="int8",
        shapes={"b1": ShapeChoice(prepack=True, ms=1.0, prepack_gain=1.5), "b8": ShapeChoice(prepack=False, ms=8.0)},
        dynamic=False,
    )
    one = per_shape.model_copy(
        update={"dynamic": True, "shapes": {k: ShapeChoice(prepack=False) for k in ("b1", "b8")}}
    )
    memory = {"text": TowerMemory(True, shared_mb=100.0, per_shape_mb=100.0, dynamic_mb=150.0)}
    # Within the budget: kept.
    assert fit_prepacks({"text": one}, memory, Budget(200, False, "auto"), {"text": per_shape})["text"].dynamic
    # 150 MB over a 120 MB budget: its sessions per shape (shared 100 + b1 prepacked 100 = 200, still
    # over), whose prepacked shape then goes too: the shared copy alone.
    fitted = fit_prepacks({"text": one}, memory, Budget(120, False, "auto"), {"text": per_shape})["text"]
    assert fitted.dynamic is False and not fitted.prepacked()


def test_serve_runs_the_one_session_or_sessions_per_shape_as_the_file_says(tmp_path: Path, settings: Settings) -> None:
    model = tmp_path / "model"
    write_toy_model(model, buckets=(1, 4))
    packed = {"b1": {"prepack": True, "prepack_gain": 1.4}, "b4": {"prepack": False}}
    unpacked = {"b1": {"prepack": False}, "b4": {"prepack": False}}
    cases = [
        ({"shapes": packed, "dynamic": True}, True),  # the one session, b1 beside it (test_b1_beside_one_session.py)
        ({"shapes": unpacked, "dynamic": False}, False),  # sessions per shape on the shared copy, as measured
        ({"shapes": unpacked}, True),  # a file from before the field: what serve did with it
        ({"shapes": packed}, False),
    ]
    for text, dynamic in cases:
        path = tmp_path / "tuning.json"
        path.write_text(json.dumps(tuning_for(model, text={"precision": "fp32", **text})))
        encoder = start(settings.model_copy(update={"model_dir": model, "buckets": [1, 4], "tuning_file": path}))
        plan = encoder.plans["text"]
        assert (plan.source, plan.dynamic) == ("tuning file", dynamic), text


def test_a_one_session_choice_is_the_defaults_where_they_run_one(tmp_path: Path, settings: Settings) -> None:
    model = tmp_path / "model"
    write_toy_model(model, buckets=(1, 4))
    plan = start(settings.model_copy(update={"model_dir": model, "buckets": [1, 4]})).plans["text"]
    assert plan.dynamic  # ONNX Runtime's CPU, the default
    shapes = {"b1": ShapeChoice(prepack=False), "b4": ShapeChoice(prepack=False)}
    defaults = default_choice(plan, TowerChoice(backend="onnxruntime", device="cpu", precision="int8", shapes=shapes))
    assert defaults.dynamic is True and same_as_default(defaults, plan)
    # The same backend and precision on sessions per shape is another configuration: it is validated.
    assert not same_as_default(defaults.model_copy(update={"dynamic": False}), plan)


def test_a_configuration_drawn_slow_in_one_pass_is_ranked_by_its_fastest_pass() -> None:
    """Each pass opens a configuration afresh, and on some hosts a session is drawn ~1.45× slow for
    its whole life (BENCHMARKS.md, issue 34): one slow draw must not decide. The one session's second
    pass was drawn slow; by the median of its two passes (6.25) the prepacked sessions (5.0) would
    beat it by more than PREPACK_GAIN, by its fastest pass it ties them."""
    samples = _samples(shared=10.0, prepacked=5.0, dynamic=None)
    for shape in SHAPES:
        samples["text", shape, f"{ORT.label} dynamic"] = [5.0 * shape[0], 7.5 * shape[0]]
    one = one_session("text", ORT, samples, shape_choices("text", ORT, samples, SHAPES))
    assert one is not None and one[1, 16].ms == 5.0
