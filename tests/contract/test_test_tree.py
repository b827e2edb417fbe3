"""The test tree, checked: tests mirror the code and share only through tests/support/ and conftest.py.

- No module imports a test module (`test_*.py`) or a conftest: by statement (anywhere in the file, relative
  imports too), by string (`importlib.import_module`, `__import__`, `pytest_plugins`). A helper two test
  modules need belongs in tests/support/; a fixture in the conftest.py of the folder above both, where
  pytest finds it without an import.
- Every test module sits in a mirror folder: tests/<area>/ for the code's packages (api, cli, demo,
  retrieval, indexer) and their subpackages (tests/indexer/<package>/ for indexer/<package>/), or one of the
  cross-cutting folders (browser, contract, system); tests/indexer/ itself holds only tests of indexer's
  root modules (test_runtime.py for indexer/runtime.py). None in tests/support/, tests/ or outside tests/.

Every rule has a test that shows its checker catching a sample.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CODE_AREAS = ("api", "cli", "demo", "indexer", "retrieval")  # tests/<area>/ mirrors the package <area>/
CROSS_CUTTING = ("browser", "contract", "system")  # tests of the whole, no package of their own
PACKAGES_ONLY = ("indexer",)  # code areas whose tests sit in tests/<area>/<package>/, bar root modules'
SKIPPED_DIRS = {"node_modules", "build", "dist", "cnclip-data", "__pycache__"}
_IMPORTS_BY_STRING = ("import_module", "__import__", "find_spec", "import_string")
_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_TEST_MODULE = re.compile(r"^(test_\w+|conftest)\.py$")


def python_files(root: Path) -> Iterator[Path]:
    """Every Python file of the checkout: hidden folders (.venv, .git, caches) and build outputs left out."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts[:-1]
        if not any(p.startswith(".") or p in SKIPPED_DIRS or p.endswith(".egg-info") for p in parts):
            yield path


def module_name(root: Path, path: Path) -> str:
    """The dotted name a file is imported by (`tests/api/__init__.py` is `tests.api`)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(root: Path, path: Path) -> set[str]:
    """Dotted names a file may import: `import a.b`, `from a import b` (a and a.b), relative imports resolved
    against the file's package, and, by string, the module-like literals of a file that imports by string
    plus every `pytest_plugins` entry."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module_name(root, path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names: set[str] = set()
    strings: set[str] = set()
    by_string = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" if module else alias.name for alias in node.names)
        elif isinstance(node, ast.Name | ast.Attribute):
            by_string |= (node.id if isinstance(node, ast.Name) else node.attr) in _IMPORTS_BY_STRING
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_NAME.match(node.value):
            strings.add(node.value)
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytest_plugins" for t in node.targets):
            names.update(
                c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)
            )
    return names | strings if by_string else names


def imports_of_test_modules(root: Path) -> list[str]:
    """`importer: imported` for every import of a test module or a conftest, by any file of the checkout."""
    files = list(python_files(root))
    tests = {module_name(root, p): p for p in files if _TEST_MODULE.match(p.name)}
    found = []
    for path in files:
        for name in sorted(imported_names(root, path) & set(tests)):
            if tests[name] != path:
                found.append(f"{path.relative_to(root).as_posix()}: {name}")
    return found


def misplaced_test_modules(root: Path) -> list[str]:
    """Test modules and conftests outside the mirror folders, each with what is wrong."""
    found = []
    for path in python_files(root):
        if not _TEST_MODULE.match(path.name):
            continue
        rel = path.relative_to(root)
        if rel.parts[0] != "tests":
            found.append(f"{rel.as_posix()}: outside tests/")
        elif path.name == "conftest.py":
            if len(rel.parts) > 2 and rel.parts[1] not in CODE_AREAS + CROSS_CUTTING:
                found.append(f"{rel.as_posix()}: a conftest outside tests/ and its mirror folders")
        elif len(rel.parts) == 2 or rel.parts[1] not in CODE_AREAS + CROSS_CUTTING:
            found.append(f"{rel.as_posix()}: not in a mirror folder ({', '.join(CODE_AREAS + CROSS_CUTTING)})")
        elif rel.parts[1] in CROSS_CUTTING:
            if len(rel.parts) > 3:
                found.append(f"{rel.as_posix()}: tests/{rel.parts[1]}/ has no subfolders")
        elif len(rel.parts) > 3 and not (root.joinpath(*rel.parts[1:-1]) / "__init__.py").is_file():
            found.append(f"{rel.as_posix()}: {'/'.join(rel.parts[1:-1])}/ is no package of the code")
        elif len(rel.parts) == 3 and rel.parts[1] in PACKAGES_ONLY:
            tested = root / rel.parts[1] / path.name.removeprefix("test_")
            if not tested.is_file():
                found.append(
                    f"{rel.as_posix()}: {rel.parts[1]}/ holds packages: tests go in tests/{rel.parts[1]}/<package>/"
                )
    return found


def test_no_module_imports_a_test_module_or_a_conftest() -> None:
    found = imports_of_test_modules(ROOT)
    assert not found, "test modules and conftests imported (move the helper to tests/support/):\n" + "\n".join(found)


def test_every_test_module_sits_in_a_mirror_folder() -> None:
    found = misplaced_test_modules(ROOT)
    assert not found, "test modules outside the mirror of the code:\n" + "\n".join(found)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_checker_sees_every_way_of_importing_a_test_module(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "tests/__init__.py": "",
            "tests/conftest.py": "pytest_plugins = ['tests.support.fixtures']\n",
            "tests/support/__init__.py": "",
            "tests/support/fixtures.py": "",
            "tests/api/__init__.py": "",
            "tests/api/test_a.py": "def helper(): ...\n",
            "tests/api/test_b.py": "from tests.api.test_a import helper\n",
            "tests/api/test_c.py": "def f():\n    from .test_a import helper\n",
            "tests/api/test_d.py": "from tests.api import test_a\n",
            "tests/api/test_e.py": "import tests.conftest\n",
            "tests/api/test_f.py": "import importlib\nimportlib.import_module('tests.api.test_a')\n",
            "tests/api/conftest.py": "pytest_plugins = ('tests.api.test_a',)\n",
            "tests/api/test_g.py": "from tests.support.fixtures import x\nNAME = 'tests.api.test_a'\n",
            "benchmarks/bench.py": "from tests.api.test_a import helper\n",
        },
    )
    assert imports_of_test_modules(root) == [
        "benchmarks/bench.py: tests.api.test_a",
        "tests/api/conftest.py: tests.api.test_a",
        "tests/api/test_b.py: tests.api.test_a",
        "tests/api/test_c.py: tests.api.test_a",
        "tests/api/test_d.py: tests.api.test_a",
        "tests/api/test_e.py: tests.conftest",
        "tests/api/test_f.py: tests.api.test_a",
    ]  # test_g: support is shared, and a string is no import in a file that never imports by string


def test_checker_sees_test_modules_outside_the_mirror(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "indexer/__init__.py": "",
            "indexer/runtime.py": "",
            "indexer/bulk/__init__.py": "",
            "tests/conftest.py": "",
            "tests/test_top.py": "",
            "tests/support/test_helper.py": "",
            "tests/support/conftest.py": "",
            "tests/misc/test_x.py": "",
            "tests/api/test_ok.py": "",
            "tests/system/test_ok.py": "",
            "tests/system/deep/test_x.py": "",
            "tests/indexer/conftest.py": "",
            "tests/indexer/test_runtime.py": "",
            "tests/indexer/test_pipeline.py": "",
            "tests/indexer/bulk/test_ok.py": "",
            "tests/indexer/nothing/test_x.py": "",
            "benchmarks/test_bench.py": "",
        },
    )
    assert [line.split(":")[0] for line in misplaced_test_modules(root)] == [
        "benchmarks/test_bench.py",
        "tests/indexer/nothing/test_x.py",
        "tests/indexer/test_pipeline.py",
        "tests/misc/test_x.py",
        "tests/support/conftest.py",
        "tests/support/test_helper.py",
        "tests/system/deep/test_x.py",
        "tests/test_top.py",
    ]
