"""benchmarks/bench_session_spread.py: batch 1 of one tower in fresh processes, and the spread."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench_session_spread import main
from retrieval.toolchain.toy_model import write_toy_model


def test_each_process_is_timed_and_the_spread_is_summed_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_toy_model(tmp_path / "m", buckets=(1, 4))
    assert main(["--model", str(tmp_path / "m"), "--tower", "text", "--processes", "2", "--seconds", "0.05"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "cores; load" in lines[0] and lines[0].endswith("m text int8 dynamic")
    times = [float(line.split()[-2]) for line in lines[1:3]]
    assert [line.split(":")[0] for line in lines[1:3]] == ["process 1", "process 2"] and all(t > 0 for t in times)
    assert lines[3].startswith(f"min {min(times):.2f}, median ") and lines[3].endswith(
        "of 2 processes over 1.2x the fastest"
    )
