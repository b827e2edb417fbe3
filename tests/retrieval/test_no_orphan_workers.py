"""`cnclip tune`'s validation worker never outlives the tune (issue 34's review): stopped and its folder
removed when the tune is SIGTERMed, and SIGTERMed by the kernel when the tune is killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from retrieval.toolchain.toy_model import write_toy_model

ROOT = Path(__file__).parents[2]
GONE_WITHIN_S = 30.0  # the worker's own graceful stop takes a few seconds at most

# `cnclip tune` as a user runs it, with the measuring replaced by a worker held open (the part that
# outlived a SIGTERMed tune); it says the worker's pid and folder, then waits to be killed.
_TUNE_HOLDING_A_WORKER = """
import sys, time
from pathlib import Path
import retrieval.toolchain.tune.report as report
from retrieval.toolchain.tune.served import running_worker

def holding_a_worker(model, out, options, progress, say, warn):
    with running_worker(model, Path("absent.json")) as worker:
        print(worker.process.pid, worker.log_path.parent, flush=True)
        time.sleep(300)

report.tune_and_write = holding_a_worker
sys.argv = ["cnclip", "tune", "--model", sys.argv[1], "--out", sys.argv[2]]
from cli.main import main
main()
"""


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = tmp_path_factory.mktemp("orphans") / "m"
    write_toy_model(model, buckets=(1,), text_lengths=(16,))
    return model


def _alive(pid: int) -> bool:
    """Running: a zombie (dead, not yet reaped by whoever adopted it) is not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + GONE_WITHIN_S
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def _start_tune(model: Path, tmp_path: Path) -> tuple[subprocess.Popen[str], int, Path]:
    tune = subprocess.Popen(
        [sys.executable, "-c", _TUNE_HOLDING_A_WORKER, str(model), str(tmp_path / "tuning.json")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert tune.stdout is not None
    line = tune.stdout.readline()  # once the worker is ready
    assert line, tune.communicate(timeout=60)[1]
    pid, folder = line.split(maxsplit=1)
    return tune, int(pid), Path(folder.strip())


@pytest.mark.parametrize("kill", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_stopped_tune_leaves_no_worker_running(small_model: Path, tmp_path: Path, kill: signal.Signals) -> None:
    tune, worker, folder = _start_tune(small_model, tmp_path)
    try:
        assert _alive(worker)
        tune.send_signal(kill)
        _, stderr = tune.communicate(timeout=60)
        assert _wait_gone(worker), f"the worker {worker} outlived a tune stopped by {kill.name}"
        assert not (tmp_path / "tuning.json").exists()
        if kill == signal.SIGTERM:  # unwound as on Ctrl-C: the worker reaped, its folder removed, one line
            assert tune.returncode == 143, stderr
            assert "cnclip tune: stopped by SIGTERM" in stderr
            assert "Traceback" not in stderr
            assert not folder.exists()
    finally:
        tune.kill()
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)
