"""The layers inside indexer/, checked by package prefix (docs/architecture.md, "The tree"): each
package imports only the layers below it, only the composition root opens storage, and no module of
indexer/, api/, cli/, demo/ or retrieval/ imports another round a circle, however it imports (at the
top, under `if TYPE_CHECKING:`, in a function). Every rule has a test that shows its checker catching a
sample."""

from __future__ import annotations

from pathlib import Path

from tests.support.import_reading import import_circles, imported_paths, module_names, python_files, rel

# --- the layers inside indexer/, as package prefixes -------------------------------------------------------
# (a file's path prefix, the module prefixes it must never import, the ones among those it may). A prefix
# names a package (`indexer.storage` is `indexer/storage/` and everything under it) or a module.
LAYERS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("indexer/domain/", ("indexer",), ("indexer.domain", "indexer.errors")),  # records and pure rules
    ("indexer/fs/", ("indexer",), ("indexer.fs", "indexer.errors")),  # the file system
    ("indexer/service/", ("indexer.storage", "indexer.bulk", "indexer.watch", "indexer.runtime"), ()),  # ports
    ("indexer/storage/", ("indexer.service", "indexer.bulk", "indexer.watch", "indexer.runtime"), ()),
    ("indexer/storage/sql/", ("indexer.storage.vectors",), ()),  # SQLAlchemy and nothing else
    ("indexer/storage/vectors/", ("indexer.storage.sql",), ()),
    ("indexer/bulk/", ("indexer.watch", "indexer.runtime"), ()),
    ("indexer/watch/", ("indexer.runtime",), ()),
    ("indexer/config.py", ("indexer.service", "indexer.storage", "indexer.bulk", "indexer.runtime"), ()),
    ("indexer/engines.py", ("indexer",), ()),
)
# Storage is reached through the service: besides storage itself, only the composition root, the schema
# migrations and the benchmarks (and tests, not checked here) build or open it: api/, cli/, demo/, the
# service, bulk/ and watch/ never do.
STORAGE = "indexer.storage"
OPENS_STORAGE = ("indexer/storage/", "indexer/runtime.py", "migrations/", "benchmarks/")
LAYERED = ("api", "benchmarks", "cli", "demo", "indexer", "migrations", "retrieval", "web")


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layer_offences(where: str, imports: set[str]) -> list[str]:
    """The imports of the file at `where` (a path from the root) that `LAYERS` and the storage rule forbid."""
    bad = set()
    for prefix, forbidden, allowed in LAYERS:
        if where.startswith(prefix):
            bad |= {m for m in imports if _under(m, forbidden) and not _under(m, allowed)}
    if not where.startswith(OPENS_STORAGE):
        bad |= {m for m in imports if _under(m, (STORAGE,))}
    return sorted(bad)


def test_each_layer_imports_only_the_layers_below_it() -> None:
    offenders = [
        f"{rel(path)}: {', '.join(bad)}"
        for path in python_files(*LAYERED)
        if (bad := layer_offences(rel(path), imported_paths(path)))
    ]
    assert not offenders, "imports against the layers (docs/architecture.md):\n" + "\n".join(offenders)


def test_checker_sees_an_import_against_the_layers(tmp_path: Path) -> None:
    sample = tmp_path / "route.py"
    sample.write_text(
        "from indexer.service.collections import CollectionService\n"
        "def route():\n    from indexer.storage.media.check import read_media\n"
    )
    imports = imported_paths(sample)
    assert layer_offences("api/routes/items.py", imports) == [
        "indexer.storage.media.check", "indexer.storage.media.check.read_media",
    ]  # fmt: skip
    assert layer_offences("indexer/runtime.py", imports) == []  # the composition root opens storage
    typed = tmp_path / "records.py"
    typed.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from indexer.service import ports\n")
    assert layer_offences("indexer/domain/records.py", imported_paths(typed)) == [
        "indexer.service", "indexer.service.ports",
    ]  # fmt: skip
    assert layer_offences("indexer/domain/names.py", {"indexer.errors", "indexer.domain.values"}) == []
    assert layer_offences("indexer/storage/sql/rows.py", {"indexer.storage.vectors.base"}) == [
        "indexer.storage.vectors.base"
    ]
    assert layer_offences("indexer/service/duplicates.py", {"indexer.storage.catalog"}) == ["indexer.storage.catalog"]


# --- no import circle, of any kind --------------------------------------------------------------------------
CIRCLE_FREE = ("indexer", "api", "cli", "demo", "retrieval")


def test_no_import_circle() -> None:
    circles = import_circles(module_names(CIRCLE_FREE))
    assert not circles, "modules that import each other (open the circle: move the shared part below both):\n" + (
        "\n".join(" <-> ".join(circle) for circle in circles)
    )


def test_checker_sees_every_kind_of_circle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.a import thing\n")  # in a function
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import d\n")
    (package / "sub" / "d.py").write_text("from .. import c\n")  # relative
    (package / "e.py").write_text("import pkg.a\n")  # imports into a circle, is in none
    assert import_circles(module_names(("pkg",), tmp_path)) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub.d"]]
