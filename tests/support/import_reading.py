"""Reading which modules a file imports, for the architecture tests (tests/contract/): by statement
anywhere in it (at the top, under `TYPE_CHECKING`, in a function) and by string; and the import graph
of whole packages, with its circles."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A string literal that names a module, in a file that imports by string, counts as an import of it.
MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
IMPORTS_BY_STRING = ("import_module", "__import__", "find_spec", "import_string")


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
            by_string |= (node.id if isinstance(node, ast.Name) else node.attr) in IMPORTS_BY_STRING
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.match(node.value):
            strings.add(node.value.split(".")[0])
    return names | strings if by_string else names


def imported_paths(path: Path) -> set[str]:
    """Full dotted modules a file imports (`from indexer import catalog` is `indexer.storage.catalog`), by
    statement anywhere in it (inside functions too) and by string, as `imported_modules` counts them."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    paths: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            paths.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            paths.add(node.module)
            paths.update(f"{node.module}.{alias.name}" for alias in node.names)
    if imported_modules(path) - {p.split(".")[0] for p in paths}:  # imports by string: every module-like literal
        paths.update(
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.match(node.value)
        )
    return paths


def python_files(*roots: str) -> list[Path]:
    return sorted(p for root in roots for p in (ROOT / root).rglob("*.py") if "versions" not in p.parts)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def module_names(roots: tuple[str, ...], base: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module under `roots` (a package is its `__init__.py`)."""
    found = {}
    for root in roots:
        for path in sorted((base / root).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def module_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that module `name` imports, by any statement anywhere in it: at the top,
    under `if TYPE_CHECKING:`, in a function; `from a import b` is module `a.b` when that is one, else `a`;
    relative imports are resolved."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    def known(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {known(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else known(base) for a in node.names}
    return {m for m in found if m is not None and m != name}


def import_circles(modules: dict[str, Path]) -> list[list[str]]:
    """Every set of modules that import each other round a circle (Tarjan's strongly connected
    components with more than one module), each sorted."""
    graph = {name: module_imports(name, path, modules) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return sorted(circles)
