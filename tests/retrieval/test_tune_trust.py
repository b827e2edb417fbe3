"""`cnclip tune` you can trust (issue 34): one configuration open at a time, its peak memory and
duration reported; a look at the load, a warning, a second measurement and an untrusted file when
other work competes, which `serve` ignores; the choice validated against the defaults."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from api.config import Settings
from retrieval.manifest import ModelManifest
from retrieval.toolchain.toy_model import write_toy_model
from retrieval.tuning import TUNING_NAME, TuningFile, read_tuning
from tests.support.tuning_files import start, tuning_for

FAST = ["--seconds", "0.01", "--buckets", "1", "--backend", "onnxruntime"]


def _tune(model: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`cnclip tune` in a fresh process, as a user runs it."""
    command = [sys.executable, "-m", "cli.main", "tune", "--model", str(model), *FAST, *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=Path(__file__).parents[2])


def test_tune_reports_its_peak_memory_within_the_base_plus_the_largest_configuration(tmp_path: Path) -> None:
    write_toy_model(tmp_path / "m", buckets=(1, 4), text_lengths=(16,))
    done = _tune(tmp_path / "m", "--validate-seconds", "0.05", "--accept-noise")
    assert done.returncode == 0, done.stderr
    tuning = TuningFile.model_validate_json((tmp_path / "m" / TUNING_NAME).read_text())
    report = tuning.report
    assert report is not None and report.seconds > 0 and report.largest_candidate_mb > 0
    # One configuration open at a time: the measuring peak is what stood between configurations plus
    # the most any one added — not the sum of them all.
    assert report.measure_peak_rss_mb <= report.base_rss_mb + report.largest_candidate_mb + 1.0
    assert report.measure_peak_rss_mb <= report.peak_rss_mb
    # And the bound: the whole run within the budget plus the largest configuration.
    assert report.peak_rss_mb <= report.base_rss_mb + tuning.memory_budget_mb + report.largest_candidate_mb
    line = next(x for x in done.stdout.splitlines() if x.startswith("took "))
    assert f"peak memory {report.peak_rss_mb:.0f} MB" in line and "one configuration open at a time" in line


# Two configurations whose sessions hold 40 MB each (touched), measured in a fresh process while a
# thread samples the resident memory every 2 ms: held open together they would stand 320 MB above
# the base; one at a time, 160 MB.
_HEAVY = """
import json, sys, threading, time
from pathlib import Path
from types import SimpleNamespace
import numpy as np
from retrieval.manifest import ModelManifest
from retrieval.toolchain.gate import Candidate
from retrieval.toolchain.tune.memory import rss_mb
from retrieval.toolchain.tune.tuner import TuneOptions, measure

class Heavy:
    def __init__(self, *args):
        self.ballast = np.ones(40 << 20, dtype=np.uint8)

    def run(self, batch):
        return batch

manifest = ModelManifest.load(Path(sys.argv[1]))
heavy = SimpleNamespace(name="heavy", shares_weights=lambda device: False, open_session=Heavy)
found = {"image": [], "text": [Candidate(heavy, "cpu", p, p) for p in ("fp32", "int8")]}
highest, stop = [0.0], threading.Event()

def sample():
    while not stop.is_set():
        highest[0] = max(highest[0], rss_mb())
        time.sleep(0.002)

base = rss_mb()
sampler = threading.Thread(target=sample)
sampler.start()
measured = measure(manifest, found, TuneOptions(rounds=2, seconds=0.05), lambda *_: None)
stop.set()
sampler.join()
print(json.dumps({"base": base, "sampled": highest[0], "largest": measured.largest_mb, "peak": measured.peak_mb}))
"""


def test_the_tuner_holds_one_configuration_open_at_a_time(tmp_path: Path) -> None:
    write_toy_model(tmp_path / "m", buckets=(1, 4), text_lengths=(16,))
    done = subprocess.run([sys.executable, "-c", _HEAVY, str(tmp_path / "m")], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    shapes = 4  # b1, b4 × 16 and 52 tokens
    assert 0.9 * 40 * shapes <= seen["largest"] <= 1.2 * 40 * shapes, seen
    assert seen["sampled"] - seen["base"] < 1.5 * 40 * shapes, seen  # both open would be 2 × 160 MB
    assert seen["peak"] >= seen["sampled"] - 5, seen  # the reported peak saw what the sampler saw


def test_tune_beside_two_busy_processes_warns_and_writes_nothing_trusted(tmp_path: Path) -> None:
    write_toy_model(tmp_path / "m", buckets=(1,), text_lengths=())
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        done = _tune(tmp_path / "m", "--validate-seconds", "0")
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert done.returncode == 0, done.stderr
    warnings = [x for x in done.stderr.splitlines() if x.startswith("warning:")]
    assert len(warnings) == 2, done.stderr
    assert "other work competes for the CPUs" in warnings[0] and "measuring again" in warnings[0]
    assert "other processes used" in warnings[0]
    assert "written marked untrusted, serve ignores it" in warnings[1]
    tuning = TuningFile.model_validate_json((tmp_path / "m" / TUNING_NAME).read_text())
    assert tuning.trusted is False and tuning.untrusted_reason
    assert tuning.report is not None and tuning.report.measurements == 2 and tuning.report.other_cpu_cores >= 0.3
    assert f"UNTRUSTED: {tuning.untrusted_reason}" in done.stdout


def test_serve_ignores_an_untrusted_file_with_one_line(
    toy_model_dir: Path, tmp_path: Path, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    data: dict[str, Any] = tuning_for(toy_model_dir, text={"precision": "fp32"})
    path = tmp_path / TUNING_NAME
    path.write_text(json.dumps(data))  # written before the field existed: trusted
    model_id = ModelManifest.load(toy_model_dir).model_id
    assert read_tuning(path, model_id, toy_model_dir).tuning is not None
    data.update(trusted=False, untrusted_reason="other processes used 1.9 of 2 cores while it measured")
    path.write_text(json.dumps(data))
    caplog.set_level(logging.INFO, logger="retrieval")
    encoder = start(settings.model_copy(update={"tuning_file": path}))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"tuning file {path} not used: it is marked untrusted (other processes used 1.9")
    assert encoder.plans["text"].precision == "int8" and encoder.plans["text"].source == "defaults"
    data["untrusted_reason"] = "two\nlines"  # a hostile reason cannot break the one line
    path.write_text(json.dumps(data))
    assert "refused (untrusted_reason" in read_tuning(path, model_id, toy_model_dir).line


def test_a_choice_not_faster_than_the_defaults_keeps_the_defaults(
    toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through `cnclip worker` processes over HTTP: the tuned text tower (fp32 instead of the default
    int8) is made to measure slower, the image tower (openvino) faster; text goes back to the defaults."""
    from retrieval.toolchain.tune import validate as validation

    real = validation.served_rate
    rates = {("text", True): 50, ("text", False): 100, ("image", True): 120, ("image", False): 100}
    served: list[tuple[str, bool, dict[str, str]]] = []

    def served_rate(worker, load, concurrency, seconds):  # type: ignore[no-untyped-def]
        assert real(worker, load, concurrency, 0.05) > 0  # really answered over HTTP
        tuned = "tuning file" in worker.plan_sources().values()
        served.append((load.tower, tuned, worker.plan_sources()))
        return rates[load.tower, tuned]

    monkeypatch.setattr(validation, "served_rate", served_rate)
    image = {"backend": "openvino", "device": "CPU", "precision": "fp32"}
    tuning = TuningFile.model_validate(tuning_for(toy_model_dir, text={"precision": "fp32"}, image=image))
    manifest = ModelManifest.load(toy_model_dir)
    checked, points, kept, worker_mb = validation.validate(toy_model_dir, manifest, tuning, 0.01, lambda *_: None)
    assert kept == ["text"]
    assert {(p.tower, p.concurrency, p.tuned_items_s, p.default_items_s) for p in points} == {
        ("text", 1, 50, 100), ("text", 8, 50, 100), ("image", 1, 120, 100), ("image", 8, 120, 100),
    }  # fmt: skip
    assert (checked.towers["text"].backend, checked.towers["text"].precision) == ("onnxruntime", "int8")
    assert checked.towers["image"] == tuning.towers["image"]
    # Four workers (two passes × tuned and default), each tower measured in each: the tuned ones planned
    # both towers from the file, the default ones from neither; each worker's memory read from /proc.
    assert {(t, tuned) for t, tuned, _ in served} == {(t, b) for t in ("text", "image") for b in (True, False)}
    assert all(set(sources.values()) == ({"tuning file"} if tuned else {"defaults"}) for _, tuned, sources in served)
    assert len(served) == 4 * 2 * (1 + len(validation.CONCURRENCIES))  # workers × towers × (settle + windows)
    assert worker_mb > 10


def test_a_case_is_called_until_its_spread_settles(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from retrieval.toolchain.tune import noise

    clock = [0.0]
    monkeypatch.setattr(noise, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    def calls(durations: list[float]) -> noise.CallStats:
        it = iter(durations)

        def run() -> None:
            clock[0] += next(it)

        return noise.sample_calls(run, seconds=0.05)

    # A warm-up, 8 erratic calls (1 and 4 ms), then steady 2 ms ones: it calls on until the quartiles settle.
    settled = calls([0.001] + [0.001, 0.004] * 4 + [0.002] * 100)
    assert settled.calls > 2 * noise.MIN_CALLS and settled.ms == pytest.approx(2.0) and not settled.noisy
    # Erratic throughout: it stops at its cap of time, marked noisy.
    erratic = calls([0.001] + [0.001, 0.004] * 500)
    assert erratic.noisy and 0.2 <= sum([0.001, 0.004] * (erratic.calls // 2)) <= 0.21
    # One slow case still gets its few calls, past its time.
    slow = calls([0.5] * 10)
    assert slow.calls == noise.MIN_CALLS


def test_the_reason_tells_a_host_that_varies_from_other_work_and_names_the_load_at_the_start() -> None:
    from retrieval.toolchain.tune.noise import noise_reason

    # Nothing else ran (0.03 cores) and half the cases varied: as on a quiet AVX2 EPYC VM.
    host = noise_reason(0.03, 31, 63, load=0.53, cores=2)
    assert host is not None and "31 of 63 cases varied more than 10% between calls" in host
    assert "though other processes used only 0.03 of 2 cores" in host and "host itself varies" in host
    assert host.endswith("load average 0.5 when tune started")
    busy = noise_reason(1.9, 31, 63, load=2.4, cores=2)
    assert busy is not None and busy.startswith("other processes used 1.9 of 2 cores") and "only" not in busy
    assert noise_reason(0.03, 10, 63, load=0.5, cores=2) is None  # a few noisy cases: trusted


def test_configurations_are_measured_in_blocks_whose_order_alternates(toy_model_dir: Path) -> None:
    from types import SimpleNamespace

    from retrieval.toolchain.gate import Candidate
    from retrieval.toolchain.tune.tuner import TuneOptions, measure

    opened: list[str] = []

    def backend(name: str) -> SimpleNamespace:
        def open_session(*_: object) -> SimpleNamespace:
            opened.append(name)
            return SimpleNamespace(run=lambda batch: batch)

        return SimpleNamespace(name=name, shares_weights=lambda device: False, open_session=open_session)

    fakes = [Candidate(backend(n), "cpu", "fp32", "fp32") for n in ("a", "b", "c")]  # type: ignore[arg-type]
    found: dict[str, list[Candidate]] = {"image": fakes, "text": []}
    manifest = ModelManifest.load(toy_model_dir)
    measured = measure(manifest, found, TuneOptions(rounds=2, seconds=0.001, buckets=[1]), lambda *_: None)
    # Each configuration opened once per pass (its shapes measured as a block), the second pass rotated
    # and reversed, so a slow minute falls on different configurations in each pass.
    assert opened == ["a", "b", "c", "a", "c", "b"]
    assert all(len(v) == 2 for v in measured.samples.values())


class _CyclicSession:
    itself: object = None

    def run(self, batch: object) -> object:
        return batch


def test_measuring_walks_only_its_own_objects_and_still_collects_what_a_closed_configuration_left(
    toy_model_dir: Path,
) -> None:
    """In a process holding much else (the suite's own, ~1 s a collection late in a run) each
    configuration's collection walked every object again: the toy tune took 150 s in the suite, 32 s alone."""
    import gc
    import weakref
    from types import SimpleNamespace

    from retrieval.toolchain.gate import Candidate
    from retrieval.toolchain.tune.tuner import TuneOptions, measure

    callers_objects = [[i] for i in range(1000)]  # what was there before: frozen, not walked
    left_behind: list[weakref.ref[Any]] = []
    seen: list[tuple[str, int, bool]] = []

    def backend(name: str) -> SimpleNamespace:
        def open_session(*_: object) -> SimpleNamespace:
            # the previous configuration's cycle was collected before this one opened
            seen.append((name, gc.get_freeze_count(), all(ref() is None for ref in left_behind)))
            session = _CyclicSession()
            session.itself = session  # a cycle: only the collector frees it once the session is dropped
            left_behind.append(weakref.ref(session))
            return session

        return SimpleNamespace(name=name, shares_weights=lambda device: False, open_session=open_session)

    fakes = [Candidate(backend(n), "cpu", "fp32", "fp32") for n in ("a", "b")]  # type: ignore[arg-type]
    assert gc.get_freeze_count() == 0
    measure(
        ModelManifest.load(toy_model_dir),
        {"image": fakes, "text": []},
        TuneOptions(rounds=2, seconds=0.001, buckets=[1]),
        lambda *_: None,
    )
    assert [name for name, _, _ in seen] == ["a", "b", "a", "b"]
    assert all(frozen >= len(callers_objects) for _, frozen, _ in seen), seen  # the caller's heap was frozen
    assert all(collected for _, _, collected in seen), seen
    assert all(ref() is None for ref in left_behind)
    assert gc.get_freeze_count() == 0  # thawed afterwards: the caller's garbage is collectable again


def test_the_report_names_the_choice_the_defaults_replaced(toy_model_dir: Path) -> None:
    from retrieval.toolchain.tune.report import report_lines
    from retrieval.tuning import TowerChoice, TuneReport

    tuning = TuningFile.model_validate(tuning_for(toy_model_dir))
    rejected = TowerChoice(backend="openvino", device="CPU", precision="bf16", shapes={"b1": {"prepack": True}})
    report = TuneReport(seconds=1, peak_rss_mb=1, kept_defaults=["text"], rejected={"text": rejected})
    lines = report_lines(tuning.model_copy(update={"report": report}))
    assert "kept the defaults for text: the choice (openvino CPU bf16, prepacked b1, 1 stream(s)) was not faster" in (
        "\n".join(lines)
    )
    # A file written by tune reads back with it (the file's strict schema).
    assert TuningFile.model_validate_json(tuning.model_copy(update={"report": report}).model_dump_json()) is not None


@pytest.mark.parametrize("seconds", [float("inf"), 1e9, 60.5, -1.0, float("nan")])
def test_a_validation_window_that_would_never_end_is_refused_before_anything_runs(
    toy_model_dir: Path, seconds: float
) -> None:
    """`--validate-seconds inf` held a worker busy for ever (the check before it ran saw only `>= 0`)."""
    from retrieval.errors import InvalidInput
    from retrieval.toolchain.tune.tuner import TuneOptions, run_tune

    with pytest.raises(InvalidInput, match="--validate-seconds must be between 0 and 60"):
        run_tune(toy_model_dir, TuneOptions(validate_seconds=seconds))
