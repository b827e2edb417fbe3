"""constraints.txt (the versions the suite was last green with, what `make install` installs) and
pyproject.toml (the ranges) agree: every requirement of the install `make install` makes is pinned, at a
version its range allows; the pins are complete (every distribution reachable from pyproject.toml through
the installed packages' own requirements is pinned); and the environment running this suite is the
locked one. A deliberate mismatch is reported (the last tests), so this test can fail."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
LOCK = ROOT / "constraints.txt"
# What the lock was recorded on (its header says so): markers are evaluated for this platform.
LOCK_PLATFORM = {
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "sys_platform": "linux",
    "os_name": "posix",
    "python_version": "3.11",
    "python_full_version": "3.11.7",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
# `make install` installs the project with this extra, then these packages with --no-deps.
INSTALLED_EXTRA = "dev"
NO_DEPS_INSTALLS = ("cn-clip",)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def read_pins(lock_text: str) -> tuple[dict[str, Version], list[str]]:
    """The pins of a constraints file by canonical name, and the lines that are not `name==version`."""
    pins: dict[str, Version] = {}
    bad: list[str] = []
    for line in lock_text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        if match is None:
            bad.append(line)
        else:
            pins[canonicalize_name(match[1])] = Version(match[2])
    return pins, bad


def project_requirements(pyproject_text: str, extra: str = INSTALLED_EXTRA) -> list[Requirement]:
    """The requirements `pip install -e .[extra]` asks for on the lock platform (self-references followed)."""
    project = tomllib.loads(pyproject_text)["project"]
    own_name = canonicalize_name(project["name"])
    optional = project.get("optional-dependencies", {})
    texts = list(project.get("dependencies", []))
    pending, seen = [extra], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in optional.get(name, []):
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == own_name:
                pending += sorted(requirement.extras)  # "cnclip-search[convert,milvus]"
            else:
                texts.append(text)
    requirements = [Requirement(text) for text in texts]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({**LOCK_PLATFORM, "extra": ""})]


def lock_problems(pyproject_text: str, lock_text: str) -> list[str]:
    """Why the lock does not fit pyproject.toml (empty when it does): unpinned, out of range, malformed."""
    pins, bad = read_pins(lock_text)
    problems = [f"not a `name==version` pin: {line!r}" for line in bad]
    for requirement in project_requirements(pyproject_text):
        name = canonicalize_name(requirement.name)
        if name not in pins:
            problems.append(f"{requirement.name} is required ({requirement}) but not pinned in constraints.txt")
        elif not requirement.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{requirement.name}=={pins[name]} is pinned but pyproject.toml asks for {requirement}")
    for name in NO_DEPS_INSTALLS:
        if name not in pins:
            problems.append(f"{name} is installed by `make install` but not pinned")
    return problems


def unpinned_dependencies(pyproject_text: str, pins: dict[str, Version]) -> list[str]:
    """Distributions reachable from pyproject.toml through the installed packages' metadata but not pinned."""
    missing: list[str] = []
    pending = [(canonicalize_name(r.name), frozenset(r.extras)) for r in project_requirements(pyproject_text)]
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        name, extras = pending.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        if name not in pins:
            missing.append(name)
            continue
        try:
            own_requirements = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # pinned, not installed: test_this_environment_is_the_locked_one says so
        for text in own_requirements:
            requirement = Requirement(text)
            wanted = requirement.marker is None or any(
                requirement.marker.evaluate({**LOCK_PLATFORM, "extra": extra}) for extra in ("", *extras)
            )
            if wanted:
                pending.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return sorted(set(missing))


def test_the_lock_pins_every_requirement_within_its_range() -> None:
    assert lock_problems(PYPROJECT.read_text(), LOCK.read_text()) == []


def test_the_lock_is_complete() -> None:
    pins, _ = read_pins(LOCK.read_text())
    assert unpinned_dependencies(PYPROJECT.read_text(), pins) == [], "run `make lock`"


def test_this_environment_is_the_locked_one() -> None:
    pins, _ = read_pins(LOCK.read_text())
    wrong = []
    for name, version in sorted(pins.items()):
        try:
            installed = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            wrong.append(f"{name}: not installed (locked {version})")
            continue
        if installed != version:
            wrong.append(f"{name}: {installed} installed, {version} locked")
    assert wrong == [], "install with `make install` (it installs from constraints.txt)"


def test_the_markers_of_the_lock_platform_are_complete() -> None:
    # A marker naming a variable LOCK_PLATFORM lacks would raise here, not be silently skipped.
    for requirement in project_requirements(PYPROJECT.read_text()):
        if requirement.marker is not None:
            Marker(str(requirement.marker)).evaluate({**LOCK_PLATFORM, "extra": ""})


def test_a_range_the_lock_does_not_meet_is_reported() -> None:
    pyproject = PYPROJECT.read_text().replace('"pytest>=8', '"pytest>=99', 1)
    assert '"pytest>=99' in pyproject
    problems = lock_problems(pyproject, LOCK.read_text())
    assert len(problems) == 1 and problems[0].startswith("pytest==") and ">=99" in problems[0]


def test_a_requirement_missing_from_the_lock_is_reported() -> None:
    lock = "\n".join(line for line in LOCK.read_text().splitlines() if not line.lower().startswith("fastapi=="))
    assert lock_problems(PYPROJECT.read_text(), lock) == [
        next(f"{r.name} is required ({r}) but not pinned in constraints.txt" for r in _named("fastapi"))
    ]
    assert "fastapi" in unpinned_dependencies(PYPROJECT.read_text(), read_pins(lock)[0])


def test_a_malformed_pin_is_reported() -> None:
    problems = lock_problems(PYPROJECT.read_text(), LOCK.read_text() + "\nnumpy>=1.26\n")
    assert problems == ["not a `name==version` pin: 'numpy>=1.26'"]


def _named(name: str) -> list[Requirement]:
    return [r for r in project_requirements(PYPROJECT.read_text()) if canonicalize_name(r.name) == name]
