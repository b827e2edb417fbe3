"""Dependencies point one way (api → indexer → retrieval), and serving never imports torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> top-level modules it must never import
FORBIDDEN = {
    "retrieval": {"fastapi", "starlette", "sqlalchemy", "alembic", "indexer", "api", "torch", "cn_clip"},
    "indexer": {"fastapi", "starlette", "api", "torch", "cn_clip"},
    "api": {"torch", "cn_clip"},
}
# Conversion and training are the only places torch may live.
TORCH_ALLOWED = ("retrieval/convert/",)


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


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
