"""`benchmarks/bench_duplicates.py` runs (a smoke size): the finder through the vector index finds the
same similar pairs and groups as the exact all-pairs search, and the table reports both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bench_duplicates_smoke_run_agrees_with_the_exact_search() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_duplicates.py"), "--size", "1200", "--rounds", "1", "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.strip().splitlines()
    assert any(line.startswith("| similar pairs (recall of exact) |") for line in lines)
    results = json.loads(lines[-1])
    index, exact = results["index"][0], results["exact"][0]
    assert index["similar_pairs"] == exact["similar_pairs"] > 0
    assert index["groups"] == exact["groups"] and index["groups"]["resized"] > 0
