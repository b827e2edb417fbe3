"""Which tests start a process: recorded in one run of the suite, repeated alone in another (.ci/run).

CI runs the suite in the system's Python, then again in a fresh venv (the README's install). A venv
changes what a *started process* finds — `sys.executable`, the `cnclip` script, site-packages, the base
interpreter beneath it — and nothing that a test does in its own process: the same packages, at the same
versions (constraints.txt), are imported either way (the product reads `sys.prefix` only to start
Triton's server: retrieval/toolchain/triton/server.py). So the venv run repeats the tests that started a
process in the first run, found by watching every way Python starts one, not by a list kept by hand:

    python3 -m pytest --record-process-tests build/process-tests.txt
    build/ci-venv/bin/python -m pytest --only-process-tests build/process-tests.txt

A process started by a shared fixture (a module's server) counts for the test that set the fixture up.
"""

from __future__ import annotations

import _posixsubprocess
import functools
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# Every door to a new process: subprocess (asyncio's too) through its own import of fork_exec or
# through posix_spawn; multiprocessing's spawn through fork_exec, its fork and pty through os.fork / os.forkpty.
STARTERS: list[tuple[ModuleType, str]] = [
    (subprocess, "_fork_exec"),
    (_posixsubprocess, "fork_exec"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "system"),
]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("process tests", "the tests that start a process (.ci/run's venv run)")
    group.addoption(
        "--record-process-tests", metavar="FILE", help="write the node ids of the tests that started a process"
    )
    group.addoption("--only-process-tests", metavar="FILE", help="run only the tests a recorded FILE names")


def pytest_configure(config: pytest.Config) -> None:
    record = config.getoption("record_process_tests")
    if record:
        config.pluginmanager.register(ProcessRecorder(Path(record)), "process-recorder")


@pytest.hookimpl(trylast=True)  # after `-m` and the other deselections: this one only narrows them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    listed = config.getoption("only_process_tests")
    if not listed:
        return
    wanted = read_record(Path(listed))
    kept = [item for item in items if item.nodeid in wanted]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
    items[:] = kept


def read_record(path: Path) -> set[str]:
    """The node ids a recording run wrote; a clear error where there is none to read."""
    try:
        wanted = {line for line in path.read_text(encoding="utf-8").splitlines() if line}
    except OSError as exc:
        raise pytest.UsageError(f"--only-process-tests: cannot read {path}: {exc.strerror}") from exc
    if not wanted:
        raise pytest.UsageError(f"--only-process-tests: {path} names no test (write it with --record-process-tests)")
    return wanted


class ProcessRecorder:
    """Watches the process-starting functions while each test (setup, call, teardown) runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.current: str | None = None
        self.starting: set[str] = set()
        self.originals: list[tuple[ModuleType, str, Callable[..., Any]]] = []

    def pytest_sessionstart(self) -> None:
        for module, name in STARTERS:
            original = getattr(module, name, None)
            if original is not None:
                self.originals.append((module, name, original))
                setattr(module, name, self._watching(original))

    def _watching(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def start(*args: Any, **kwargs: Any) -> Any:
            if self.current is not None:
                self.starting.add(self.current)
            return original(*args, **kwargs)

        return start

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        self.current = item.nodeid
        yield
        self.current = None

    def pytest_sessionfinish(self) -> None:
        for module, name, original in self.originals:
            setattr(module, name, original)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(f"{nodeid}\n" for nodeid in sorted(self.starting)), encoding="utf-8")
