"""Triton's own load tool, `perf_analyzer`, where it runs — and one line saying why not where it does not.

PyPI's `perf-analyzer` installs on Debian 12 (glibc 2.36) as a 2 kB stub: its binary wheels need a
newer glibc, so pip falls back to a placeholder with no program in it. A `perf_analyzer` found on PATH
may also be a small wrapper script, or a binary whose libraries this system lacks. `find_perf_analyzer`
runs it once (`--version`) and believes only an answer; `run_cell` drives one concurrency of one model
and reads perf_analyzer's CSV (latencies in microseconds, as the seed's table).
"""

from __future__ import annotations

import base64
import csv
import importlib.metadata
import json
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

STUB_BYTES = 64 * 1024  # the real program is a multi-megabyte ELF binary; a stub or wrapper is a few kB of text
SIGNS_IT_DOES_NOT_RUN = ("GLIBC", "error while loading shared libraries", "No module named", "not found")


@dataclass(frozen=True)
class PerfAnalyzer:
    """Where perf_analyzer is and whether it runs; `note` is the one line the benchmark prints."""

    path: str | None
    runs: bool
    note: str


def _libc() -> str:
    libc, version = platform.libc_ver()
    return f"{libc or 'libc'} {version}".strip()


def _pypi_stub_note() -> str | None:
    """The PyPI package installed without a program: its size and version, or None when not installed."""
    try:
        dist = importlib.metadata.distribution("perf-analyzer")
    except importlib.metadata.PackageNotFoundError:
        return None
    size = sum((f.size or 0) for f in dist.files or [])
    return (
        f"perf_analyzer {dist.version} from PyPI is a {size:,} B stub with no program "
        f"(its binary wheels need a newer glibc than this {_libc()})"
    )


def find_perf_analyzer(path: str | None = None) -> PerfAnalyzer:
    """perf_analyzer at `path` (default: on PATH), tried once; a stub, a wrapper that fails or a binary
    that cannot load its libraries is reported as not running, in one line."""
    path = path or shutil.which("perf_analyzer")
    if path is None:
        note = _pypi_stub_note() or "perf_analyzer is not installed"
        return PerfAnalyzer(None, False, note)
    file = Path(path)
    size = file.stat().st_size
    with file.open("rb") as f:
        is_binary = f.read(4) == b"\x7fELF"
    stub = not is_binary and size < STUB_BYTES
    try:
        probe = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return PerfAnalyzer(path, False, f"{path} does not run: {type(exc).__name__}: {exc}")
    said = (probe.stdout + probe.stderr).strip()
    first_line = said.splitlines()[0] if said else f"exit status {probe.returncode}, no output"
    # An old perf_analyzer without --version prints its usage and fails: that still is the program running.
    answered = probe.returncode == 0 or "--concurrency-range" in said
    if any(sign in said for sign in SIGNS_IT_DOES_NOT_RUN) or not answered:
        if stub:
            return PerfAnalyzer(
                path, False, f"{path} is a {size:,} B stub, not the perf_analyzer program: {first_line}"
            )
        return PerfAnalyzer(path, False, f"{path} does not run here ({_libc()}): {first_line}")
    return PerfAnalyzer(path, True, f"{path}: {first_line}")


def write_input_data(path: Path, name: str, datatype: str, items: list[np.ndarray] | list[bytes]) -> None:
    """perf_analyzer's --input-data file: one entry per item (each request sends the next), shapes
    without the batch dimension."""
    entries = []
    for item in items:
        if datatype == "BYTES":
            assert isinstance(item, bytes)
            entries.append({name: {"b64": base64.b64encode(item).decode(), "shape": [1]}})
        else:
            array = np.asarray(item)
            entries.append({name: {"content": array.ravel().tolist(), "shape": list(array.shape)}})
    path.write_text(json.dumps({"data": entries}))


@dataclass(frozen=True)
class PerfResult:
    infer_per_s: float
    p50_us: float
    p99_us: float


def run_cell(
    tool: PerfAnalyzer,
    url: str,
    model: str,
    concurrency: int,
    duration_s: float,
    input_data: Path,
    csv_path: Path,
    extra: tuple[str, ...] = (),
) -> PerfResult:
    """One concurrency of `model` at `url` (host:port, HTTP), one time window of `duration_s` after
    perf_analyzer's own warm-up and stabilisation."""
    assert tool.path is not None and tool.runs
    command = [
        tool.path,
        *("-m", model, "-u", url, "-i", "http", "-b", "1"),
        *("--concurrency-range", f"{concurrency}:{concurrency}"),
        *("--measurement-mode", "time_windows", "--measurement-interval", str(int(duration_s * 1000))),
        *("--input-data", str(input_data), "-f", str(csv_path)),
        *extra,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60 + 20 * duration_s)
    if done.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed ({done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
    return read_csv(csv_path, concurrency)


def read_csv(csv_path: Path, concurrency: int) -> PerfResult:
    """perf_analyzer's `-f` CSV: the row of `concurrency` (latency columns in microseconds)."""
    with csv_path.open(newline="") as f:
        for row in csv.DictReader(f):
            if int(row["Concurrency"]) == concurrency:
                return PerfResult(float(row["Inferences/Second"]), float(row["p50 latency"]), float(row["p99 latency"]))
    raise RuntimeError(f"{csv_path} has no row for concurrency {concurrency}")
