"""The tests a venv can fail: recorded in one run of the suite, repeated alone in another (.ci/run).

CI runs the suite in the system's Python, then again in a fresh venv (the README's install). A venv
changes two things a test can meet: what a *started process* finds (`sys.executable`, the `cnclip`
script, site-packages, the base interpreter beneath it), and what is *installed* (the distributions
whose metadata `importlib.metadata` reads: the lock file's check of the running environment). Code a
test runs in its own process is otherwise the same code on the same packages at the same versions
(the product reads `sys.prefix` only to start Triton's server: retrieval/toolchain/triton/server.py).
So the venv run repeats the tests that started a process or read what is installed in the first run,
found by watching, not by a list kept by hand:

    python3 -m pytest --record-venv-tests=build/venv-tests.txt
    build/ci-venv/bin/python -m pytest --only-venv-tests=build/venv-tests.txt

A process started by a shared fixture (a module's server) counts for the test that set the fixture up.
"""

from __future__ import annotations

import _posixsubprocess
import functools
import importlib.metadata
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Every door to a new process: subprocess (asyncio's too) through its own import of fork_exec or
# through posix_spawn; multiprocessing's spawn through fork_exec, its fork and pty through os.fork / os.forkpty.
# And every read of the installed distributions: version(), requires(), metadata(), distributions() go
# through Distribution.from_name or Distribution.discover.
WATCHED: list[tuple[Any, str]] = [
    (subprocess, "_fork_exec"),
    (_posixsubprocess, "fork_exec"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "system"),
    (importlib.metadata.Distribution, "from_name"),
    (importlib.metadata.Distribution, "discover"),
]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("venv tests", "the tests a venv can fail (.ci/run's venv run)")
    group.addoption(
        "--record-venv-tests",
        metavar="FILE",
        help="write the node ids of the tests that started a process or read what is installed",
    )
    group.addoption(
        "--only-venv-tests",
        metavar="FILE",
        help="run only the tests a recorded FILE names (give it as =FILE: a separate FILE is taken for a path to test)",
    )


def pytest_configure(config: pytest.Config) -> None:
    record = config.getoption("record_venv_tests")
    if record:
        config.pluginmanager.register(VenvTestRecorder(Path(record)), "venv-test-recorder")


@pytest.hookimpl(trylast=True)  # after `-m` and the other deselections: this one only narrows them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    listed = config.getoption("only_venv_tests")
    if not listed:
        return
    wanted = read_record(Path(listed))
    kept: list[pytest.Item] = []
    left_out: list[pytest.Item] = []
    for item in items:
        (kept if item.nodeid in wanted else left_out).append(item)
    config.hook.pytest_deselected(items=left_out)
    items[:] = kept


def read_record(path: Path) -> set[str]:
    """The node ids a recording run wrote; a clear error where there is none to read."""
    try:
        wanted = {line for line in path.read_text(encoding="utf-8").splitlines() if line}
    except OSError as exc:
        raise pytest.UsageError(f"--only-venv-tests: cannot read {path}: {exc.strerror}") from exc
    if not wanted:
        raise pytest.UsageError(f"--only-venv-tests: {path} names no test (write it with --record-venv-tests)")
    return wanted


class VenvTestRecorder:
    """Watches `WATCHED` while each test (setup, call, teardown) runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.current: str | None = None
        self.recorded: set[str] = set()
        self.originals: list[tuple[Any, str, Any]] = []

    def pytest_sessionstart(self) -> None:
        for owner, name in WATCHED:
            original = owner.__dict__.get(name)  # a classmethod stays one (getattr would bind it)
            if original is not None:
                self.originals.append((owner, name, original))
                setattr(owner, name, self._watching(original))

    def _watching(self, original: Any) -> Any:
        if isinstance(original, classmethod):
            return classmethod(self._watching(original.__func__))

        @functools.wraps(original)
        def watched(*args: Any, **kwargs: Any) -> Any:
            if self.current is not None:
                self.recorded.add(self.current)
            return original(*args, **kwargs)

        return watched

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        self.current = item.nodeid
        yield
        self.current = None

    def pytest_sessionfinish(self) -> None:
        for owner, name, original in self.originals:
            setattr(owner, name, original)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(f"{nodeid}\n" for nodeid in sorted(self.recorded)), encoding="utf-8")
