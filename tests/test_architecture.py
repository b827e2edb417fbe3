"""Dependencies point one way (demo → api → indexer → retrieval), also for imports made by string
(`importlib.import_module("x")`, `__import__`), and serving never imports torch."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> top-level modules it must never import
FORBIDDEN = {
    "retrieval": {"fastapi", "starlette", "sqlalchemy", "alembic", "indexer", "api", "demo", "torch", "cn_clip"},
    "indexer": {"fastapi", "starlette", "api", "demo", "torch", "cn_clip"},
    "api": {"demo", "torch", "cn_clip"},
}
# A string literal that names a module, in a file that imports by string, counts as an import of it.
_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_IMPORTS_BY_STRING = ("import_module", "__import__", "find_spec", "import_string")
# Conversion and training are the only places torch may live.
TORCH_ALLOWED = ("retrieval/toolchain/convert/",)


def imported_modules(path: Path) -> set[str]:
    """Top-level modules a file imports: by statement, and by string when it imports by string at all
    (every module-like string literal then counts, so a name kept in a tuple is caught too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    strings: set[str] = set()
    by_string = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Name | ast.Attribute):
            by_string |= (node.id if isinstance(node, ast.Name) else node.attr) in _IMPORTS_BY_STRING
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_NAME.match(node.value):
            strings.add(node.value.split(".")[0])
    return names | strings if by_string else names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_point_one_way(package: str) -> None:
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        forbidden = set(FORBIDDEN[package])
        if rel.startswith(TORCH_ALLOWED):
            forbidden -= {"torch", "cn_clip"}
        bad = imported_modules(path) & forbidden
        if bad:
            offenders.append(f"{rel}: {', '.join(sorted(bad))}")
    assert not offenders, "imports against the layering:\n" + "\n".join(offenders)


def test_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("import os\nfrom fastapi import FastAPI\nimport torch.nn as nn\nfrom . import x\n")
    assert imported_modules(sample) == {"os", "fastapi", "torch"}


def test_checker_sees_imports_made_by_string(tmp_path: Path) -> None:
    sample = tmp_path / "cli.py"
    sample.write_text(
        "import importlib\nMODULES = ('indexer.cli', 'demo.cli')\n"
        "for m in MODULES:\n    importlib.import_module(m).register(app)\n"
    )
    assert {"indexer", "demo"} <= imported_modules(sample)
    dunder = tmp_path / "d.py"
    dunder.write_text("cli = __import__('demo.cli')\n")
    assert "demo" in imported_modules(dunder)
    plain = tmp_path / "p.py"
    plain.write_text("label = 'demo'\n")  # a string in a file that never imports by string
    assert "demo" not in imported_modules(plain)
