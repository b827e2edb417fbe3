""".ci/run's venv run repeats the tests a venv can fail (tests/support/venv_tests.py): `--record-venv-tests`
names every test that started a process, by each of Python's ways, or read the installed distributions'
metadata, and no other; a fixture's process counts for the test that set it up; `--only-venv-tests` runs
exactly those, after `-m`; a missing or empty record is a usage error, never a run of nothing that passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = """
import importlib.metadata, multiprocessing, os, subprocess, sys
from importlib.metadata import version
import pytest

@pytest.fixture(scope="module")
def server():
    return subprocess.Popen([sys.executable, "-c", "pass"]).wait()

def test_subprocess(): subprocess.run([sys.executable, "-c", "pass"], check=True)
def test_posix_spawn(): subprocess.run(["true"], close_fds=False, check=True)
def test_in_process(): assert sum([1, 2]) == 3
def test_spawn_context():
    child = multiprocessing.get_context("spawn").Process(target=print); child.start(); child.join()
def test_fork_context():
    child = multiprocessing.get_context("fork").Process(target=print); child.start(); child.join()
def test_shell(): assert os.system("true") == 0
def test_reads_a_version(): assert version("pytest")
def test_lists_the_distributions(): assert any(True for _ in importlib.metadata.distributions())
def test_sets_up_the_server(server): assert server == 0
def test_reuses_the_server(server): assert server == 0
@pytest.mark.slow
def test_slow_and_spawning(): subprocess.run(["true"], check=True)
"""

RECORDED = {"subprocess", "posix_spawn", "spawn_context", "fork_context", "shell", "sets_up_the_server"}
RECORDED |= {"reads_a_version", "lists_the_distributions"}


def sample_project(tmp_path: Path) -> Path:
    """A project laid out as this one: the plugin named by its tests' conftest, the tests under testpaths."""
    project = tmp_path / "sample"
    (project / "checks").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["checks"]\naddopts = "-m \'not slow\'"\n'
    )
    (project / "checks" / "conftest.py").write_text('pytest_plugins = ["tests.support.venv_tests"]\n')
    (project / "checks" / "test_sample.py").write_text(SAMPLE)
    (project / "build").mkdir()
    return project


def pytest_run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m pytest ARGS` in `project`, as .ci/run's `make test PYTEST_ARGS=…` runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_the_record_names_the_tests_a_venv_can_fail_and_the_second_run_runs_those(tmp_path: Path) -> None:
    project = sample_project(tmp_path)
    record = project / "build" / "venv-tests.txt"

    recorded = pytest_run(project, "--record-venv-tests=build/venv-tests.txt")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    names = {line.rsplit("::test_", 1)[1] for line in record.read_text().splitlines()}
    assert names == RECORDED

    # The record exists now: given as `--only-venv-tests FILE`, pytest would take FILE for the path to
    # test and never load the conftest naming the plugin ("unrecognized arguments"); .ci/run gives `=FILE`.
    repeated = pytest_run(project, "--only-venv-tests=build/venv-tests.txt", "-vv")  # -q -vv: one line a test
    assert repeated.returncode == 0, repeated.stdout + repeated.stderr
    ran = {line.split("::test_", 1)[1].split()[0] for line in repeated.stdout.splitlines() if " PASSED" in line}
    assert ran == RECORDED and "3 deselected" in repeated.stdout  # in_process, reuses_the_server, the slow one


def test_a_missing_or_empty_record_is_a_usage_error(tmp_path: Path) -> None:
    project = sample_project(tmp_path)
    missing = pytest_run(project, f"--only-venv-tests={tmp_path / 'absent.txt'}")
    assert missing.returncode == 4 and "cannot read" in missing.stderr and "absent.txt" in missing.stderr
    (tmp_path / "empty.txt").write_text("")
    empty = pytest_run(project, f"--only-venv-tests={tmp_path / 'empty.txt'}")
    assert empty.returncode == 4 and "names no test" in empty.stderr
