"""The architecture, checked: dependencies point one way (cli → demo → api → indexer → retrieval; nothing
imports cli), also for imports made by string (`importlib.import_module("x")`, `__import__`); serving
never imports torch; typer and rich live in cli/ only; the layers inside indexer/ and the absence of
import circles are tests/contract/test_layers.py's; nothing outside the registries
branches on an engine's, backend's, device's or provider's name; the runtime core of retrieval/ never imports its toolchain; modules and
functions stay short. Every rule has a test that shows its checker catching a sample."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.import_reading import ROOT, imported_modules, imported_paths, python_files, rel

# package -> top-level modules it must never import
CLI_ONLY = {"cli", "typer", "rich"}  # the command line, and the libraries only it uses
FORBIDDEN = {
    "retrieval": {"fastapi", "starlette", "sqlalchemy", "alembic", "indexer", "api", "demo", "torch", "cn_clip"}
    | CLI_ONLY,
    "indexer": {"fastapi", "starlette", "api", "demo", "torch", "cn_clip"} | CLI_ONLY,
    "api": {"demo", "torch", "cn_clip"} | CLI_ONLY,
    "demo": CLI_ONLY,
    "migrations": {"api", "demo"} | CLI_ONLY,
    "web": CLI_ONLY,
}
# Conversion and training are the only places torch may live.
TORCH_ALLOWED = ("retrieval/toolchain/convert/",)


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


# --- full module paths ------------------------------------------------------------------------------
def test_checker_sees_full_module_paths(tmp_path: Path) -> None:
    sample = tmp_path / "route.py"
    sample.write_text(
        "def f():\n    from indexer.storage import catalog\n    from indexer.storage.sql.rows import ItemRows\n"
    )
    assert {"indexer.storage.catalog", "indexer.storage.sql.rows"} <= imported_paths(sample)
    by_string = tmp_path / "s.py"
    by_string.write_text("import importlib\nimportlib.import_module('indexer.storage.vectors.faiss.store')\n")
    assert "indexer.storage.vectors.faiss.store" in imported_paths(by_string)


# What calls the collection service and never the catalog behind it.
THROUGH_THE_SERVICE = ("api/", "cli/", "demo/", "indexer/bulk/", "indexer/watch/")


def catalog_reach_through(path: Path) -> list[int]:
    """Lines where a file reaches the catalog behind an object (`service.catalog`, `rt.catalog`): no
    import needed, so the import rule alone would not see it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return sorted(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("catalog", "rows"))


def test_no_reach_through_the_service_to_the_catalog() -> None:
    offenders = [
        f"{rel(path)}: lines {lines}"
        for path in python_files("api", "cli", "demo", "indexer")
        if rel(path).startswith(THROUGH_THE_SERVICE) and (lines := catalog_reach_through(path))
    ]
    assert not offenders, "the catalog reached behind the service:\n" + "\n".join(offenders)


def test_checker_sees_a_reach_through(tmp_path: Path) -> None:
    sample = tmp_path / "route.py"
    sample.write_text("def f(service):\n    service.search('x')\n    return service.catalog.get(1)\n")
    assert catalog_reach_through(sample) == [3]


# --- engines are chosen in the registry only ------------------------------------------------------------
# The registry and the engines' own modules may name engines; nothing else branches on a name.
ENGINE_MODULES = (
    "indexer/engines.py",
    "indexer/storage/vectors/faiss/store.py",
    "indexer/storage/vectors/milvus/store.py",
    "indexer/storage/vectors/milvus/plan.py",
)


def name_branches(text: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) where source text compares a value with one of `names`, keys a dict by one or
    matches one. A name merely written down (a label, a default, a call's argument, a `Literal`) is no branch."""
    tree = ast.parse(text)

    def named(node: ast.AST | None) -> list[str]:
        if isinstance(node, ast.Constant):
            return [node.value] if isinstance(node.value, str) and node.value in names else []
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return [name for element in node.elts for name in named(element)]
        return []

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            hits = [n for part in (node.left, *node.comparators) for n in named(part)]
        elif isinstance(node, ast.Dict):
            hits = [n for key in node.keys for n in named(key)]
        elif isinstance(node, ast.MatchValue):
            hits = named(node.value)
        else:
            continue
        found += [(node.lineno, name) for name in hits]
    return sorted(set(found))


def engine_name_branches(path: Path, names: set[str]) -> list[int]:
    """Lines where a file compares a value with an engine name, keys a dict by one, or matches one."""
    return sorted({line for line, _ in name_branches(path.read_text(encoding="utf-8"), names)})


def test_nothing_outside_the_registry_branches_on_an_engine_name() -> None:
    from indexer.engines import ENGINES

    offenders = [
        f"{rel(path)}: lines {lines}"
        for path in python_files("api", "cli", "demo", "indexer", "retrieval")
        if rel(path) not in ENGINE_MODULES and (lines := engine_name_branches(path, set(ENGINES)))
    ]
    assert not offenders, "engine chosen by name outside indexer/engines.py:\n" + "\n".join(offenders)


def test_checker_sees_a_branch_on_an_engine_name(tmp_path: Path) -> None:
    sample = tmp_path / "open.py"
    sample.write_text(
        "if settings.vector_store == 'milvus':\n    pass\n"
        "ok = name in ('faiss', 'other')\n"
        "openers = {'faiss': 1}\n"
        "match name:\n    case 'milvus':\n        pass\n"
        "label = 'milvus'  # a string is not a branch\n"
    )
    assert engine_name_branches(sample, {"faiss", "milvus"}) == [1, 3, 4, 6]


# --- engines, backends, devices and providers are chosen in their registries only --------------------------
# The registries and their records' own modules may name what they register: indexer/engines.py and the
# engine modules, retrieval/backends/ (the runtime backends and ONNX Runtime's providers) and the Triton
# export backends. Everything else asks a record (`record.on_host`, `backend.triton_kind(device)`, …).
REGISTRY_MODULES = (*ENGINE_MODULES, "retrieval/backends/", "retrieval/toolchain/triton/backends.py")
SCANNED = ("api", "benchmarks", "cli", "demo", "indexer", "migrations", "retrieval")
# Words spelled like a registered name that are not a choice of engine, backend or provider (file, name).
NOT_A_BRANCH = {
    ("retrieval/tuning.py", "cpu"): "the tuning fingerprint's key for the host CPU's model name",
    ("benchmarks/bench_convert.py", "onnxruntime"): "the report's key for ONNX Runtime's version",
    ("benchmarks/bench_engines.py", "faiss"): "the benchmark's own matrix (faiss, milvus-lite, milvus-server)",
    ("benchmarks/bench_engines.py", "milvus"): "the same matrix: it builds each engine it compares itself",
    ("benchmarks/load_test.py", "faiss"): "a load-test mode that searches a bare FAISS index",
    ("indexer/bulk/cluster/ray_session.py", "NPU"): "Ray's resource name for Ascend NPUs (`ray start --resources`)",
}
# Not checked here, on purpose: the settings' pydantic `Literal` choices (CNCLIP_PROVIDER, CNCLIP_BACKEND)
# and export.py's `Backend` are declarations for the settings table and type checkers, not branches;
# `test_declared_choices_are_the_registries` holds each equal to its registry instead.


def registered_names() -> set[str]:
    """Every name a registry holds: engines, runtime backends and their devices, ONNX Runtime's providers
    (our names and its own), Triton export backends. A record added to a registry is checked at once."""
    from indexer.engines import ENGINES
    from retrieval.backends import BACKENDS
    from retrieval.backends.ort_providers import PROVIDERS
    from retrieval.toolchain.triton.backends import TRITON_BACKENDS

    names = set(ENGINES) | {b.name for b in BACKENDS} | {d for b in BACKENDS for d in b.devices}
    return names | set(PROVIDERS) | {p.ort_name for p in PROVIDERS.values()} | set(TRITON_BACKENDS)


def registry_name_offenders(files: list[tuple[str, str]], names: set[str]) -> list[str]:
    """`file: line name` for each branch on a registered name in (relative path, text) outside the
    registries and `NOT_A_BRANCH`."""
    return [
        f"{rel}: line {line} {name!r}"
        for rel, text in files
        if not rel.startswith(REGISTRY_MODULES)
        for line, name in name_branches(text, names)
        if (rel, name) not in NOT_A_BRANCH
    ]


def test_nothing_outside_the_registries_branches_on_an_engine_backend_or_provider_name() -> None:
    files = [(rel(path), path.read_text(encoding="utf-8")) for path in python_files(*SCANNED)]
    names = registered_names()
    offenders = registry_name_offenders(files, names)
    assert not offenders, "chosen by name outside the registries (ask the record):\n" + "\n".join(offenders)
    # Every exception is still needed: a stale entry would hide the next real branch in that file.
    used = {(rel, name) for rel, text in files for _, name in name_branches(text, names)}
    assert set(NOT_A_BRANCH) <= used, f"stale NOT_A_BRANCH entries: {sorted(set(NOT_A_BRANCH) - used)}"


def test_checker_sees_a_branch_on_a_backend_or_provider_name() -> None:
    planted = (
        "if config.provider == 'cuda':\n    pass\n"
        "kind = {'cpu': 'KIND_CPU'}.get(provider, 'KIND_MODEL')\n"
        "match backend:\n    case 'openvino':\n        pass\n"
        "gpu = name in ('CUDAExecutionProvider', 'other')\n"
        "static = options.backend != 'npu_ge'\n"
        "label = 'cuda'  # a name written down is not a branch\n"
        "choices = Literal['cpu', 'cuda']  # a declaration\n"
        "session = open(providers=['CPUExecutionProvider'])  # an argument\n"
    )
    names = registered_names()
    assert name_branches(planted, names) == [
        (1, "cuda"), (3, "cpu"), (5, "openvino"), (7, "CUDAExecutionProvider"), (8, "npu_ge"),
    ]  # fmt: skip
    assert registry_name_offenders([("api/planted.py", planted)], names) == [
        "api/planted.py: line 1 'cuda'",
        "api/planted.py: line 3 'cpu'",
        "api/planted.py: line 5 'openvino'",
        "api/planted.py: line 7 'CUDAExecutionProvider'",
        "api/planted.py: line 8 'npu_ge'",
    ]
    # The same text inside a registry is the registry's business; an exception covers its own file only.
    assert registry_name_offenders([("retrieval/backends/new.py", planted)], names) == []
    assert registry_name_offenders([("retrieval/tuning.py", "x = {'cpu': 1}\n")], names) == []
    assert registry_name_offenders([("retrieval/other.py", "x = {'cpu': 1}\n")], names) == [
        "retrieval/other.py: line 1 'cpu'"
    ]


def test_declared_choices_are_the_registries() -> None:
    """The settings' `Literal` choices and export.py's `Backend` list exactly what the registries hold."""
    from typing import get_args

    from retrieval.backends import BACKENDS
    from retrieval.backends.ort_providers import PROVIDERS
    from retrieval.config import RuntimeSettings
    from retrieval.toolchain.triton.backends import TRITON_BACKENDS
    from retrieval.toolchain.triton.export import Backend

    fields = RuntimeSettings.model_fields
    assert get_args(fields["provider"].annotation) == ("auto", *PROVIDERS)
    assert get_args(fields["backend"].annotation) == ("auto", *(b.name for b in BACKENDS))
    assert get_args(Backend) == tuple(TRITON_BACKENDS)


# --- the runtime core apart from the toolchain ---------------------------------------------------------------
def toolchain_imports(path: Path) -> set[str]:
    return {p for p in imported_paths(path) if p == "retrieval.toolchain" or p.startswith("retrieval.toolchain.")}


def test_the_runtime_core_never_imports_the_toolchain() -> None:
    offenders = [
        f"{rel(path)}: {', '.join(sorted(bad))}"
        for path in python_files("retrieval")
        if not rel(path).startswith("retrieval/toolchain/") and (bad := toolchain_imports(path))
    ]
    assert not offenders, "the runtime core imports the toolchain:\n" + "\n".join(offenders)


def test_checker_sees_the_core_importing_the_toolchain(tmp_path: Path) -> None:
    sample = tmp_path / "encoder.py"
    sample.write_text("def f():\n    from retrieval.toolchain.convert import model\n")
    assert toolchain_imports(sample) == {"retrieval.toolchain.convert", "retrieval.toolchain.convert.model"}


# --- short modules and functions ---------------------------------------------------------------------------
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
SIZED = ("api", "benchmarks", "cli", "demo", "indexer", "migrations", "retrieval")


def too_long(path: Path) -> list[str]:
    """The module, if it has more than MAX_MODULE_LINES lines, and every function (a method, a nested
    one) longer than MAX_FUNCTION_LINES, from its `def` to its last line."""
    text = path.read_text(encoding="utf-8")
    found = []
    if len(text.splitlines()) > MAX_MODULE_LINES:
        found.append(f"{len(text.splitlines())} lines")
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{node.name}() {length} lines")
    return found


def test_modules_and_functions_are_short() -> None:
    offenders = [f"{rel(path)}: {', '.join(found)}" for path in python_files(*SIZED) if (found := too_long(path))]
    assert not offenders, "split these by responsibility:\n" + "\n".join(offenders)


def test_checker_sees_a_long_module_and_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    sample = tmp_path / "long.py"
    sample.write_text(
        f"def short():\n    return 1\n\n\nclass C:\n    def long(self):\n{body}\n" + "\n" * MAX_MODULE_LINES
    )
    assert too_long(sample) == [
        f"{MAX_MODULE_LINES + MAX_FUNCTION_LINES + 6} lines",
        f"long() {MAX_FUNCTION_LINES + 1} lines",
    ]
