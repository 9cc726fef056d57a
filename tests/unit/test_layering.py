"""DESIGN layering: `domain` stays pure; dependencies point inward."""

from __future__ import annotations

import ast
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"domain", "ledger", "projections", "publisher"}
IO_MODULES = {
    "sqlalchemy",
    "pymysql",
    "sqlite3",
    "os",
    "io",
    "pathlib",
    "socket",
    "subprocess",
    "shutil",
    "tempfile",
    "http",
    "urllib",
    "requests",
    "click",
    "tqdm",
    "asyncio",
    "threading",
    "multiprocessing",
    "eventsourcing.persistence",
    "eventsourcing.application",
    "eventsourcing.sqlite",
    "eventsourcing.postgres",
    "eventsourcing.popo",
    "time",
}
#: Which of our packages each layer may import (its own modules are always allowed).
#: Dependencies point inward: entrypoints -> commands/audit -> store wiring -> log/views -> domain.
ALLOWED_OURS = {
    "domain": set(),
    "publisher": {"domain"},
    # Structured logging (stdlib only): any layer above the pure ones may log through it.
    "ledger.observability": set(),
    # Views declare their tables with the log's identity column types (R3): one
    # declaration of binary identity semantics for every table in the store.
    "projections": {"domain", "ledger.log.sqltypes"},
    # The read model's queries stream the view tables through the log's engine helper.
    "projections.queries": {"domain", "projections", "ledger.log.sqltypes", "ledger.log.db"},
    "ledger.log": {"domain"},
    # The store keeps the publisher's derived fragments (its table, read and written
    # in the shapes of the pure ``publisher.fragments``): publisher is as inward as views.
    "ledger.store": {"domain", "ledger.log", "ledger.observability", "projections", "publisher"},
    # The sources adapter: pack content from git and the file system (R5).
    "ledger.sources": {"domain"},
    "ledger.commands": {
        "domain",
        "ledger.log",
        "ledger.observability",
        "ledger.sources",
        "ledger.store",
        "projections",
        "publisher",
    },
    "ledger.audit": {
        "domain",
        "ledger.log",
        "ledger.store",
        "ledger.sources",
        "projections",
        "publisher",
    },
    # What the store's own operations return (the read and admin side's results).
    "ledger.results": {"domain", "projections"},
    # The store's own operations (admin, reads, lease state, import, projections).
    "ledger.operations": {
        "domain",
        "ledger.log",
        "ledger.store",
        "ledger.commands",
        "ledger.audit",
        "ledger.results",
        "ledger.sources",
        "projections",
    },
    # The public Python API composes everything below the entrypoints.
    "ledger.api": {
        "domain",
        "ledger.log",
        "ledger.store",
        "ledger.commands",
        "ledger.audit",
        "ledger.observability",
        "ledger.operations",
        "ledger.results",
        "ledger.sources",
        "ledger.witness",  # the collector's tlog-witness client (R29)
        "projections",
    },
    # The runtime client speaks HTTP to a server; it shares only the pure domain (the
    # digests and result types of ``domain.served``) with the rest: no server stack.
    "ledger.client": {"domain", "ledger.client_keys"},
    # Its policy, state file and learned log keys (R29): the pure domain alone, likewise.
    "ledger.client_keys": {"domain"},
    # Entrypoints are thin adapters over the API (and the audit's schema generators);
    # the CLI checks --db with the URL rules alone (stdlib) before it imports the API.
    "ledger.cli": {
        "domain",
        "ledger.api",
        "ledger.audit",
        "ledger.http",
        "ledger.log.url",
        "ledger.observability",
        "ledger.witness",
    },
    # The witness (R29) runs apart from any store: its own SQLite file, the pure notes
    # and Merkle proofs, and the structured logs.
    "ledger.witness": {"domain", "ledger.observability"},
    "ledger.http": {
        "domain",
        "ledger.api",
        "ledger.observability",
        "ledger.store",
        "projections.reader",
        "projections.credentials",  # the live credentials bearer tokens are checked against
        "projections.checks",  # the named R28 checks (a test-only switch each)
    },
}


def _layer_of(module: str) -> str | None:
    """The most specific layer ``module`` belongs to."""
    best = None
    for layer in ALLOWED_OURS:
        if (module == layer or module.startswith(layer + ".")) and (
            best is None or len(layer) > len(best)
        ):
            best = layer
    return best


def _allowed(importer: str, imported: str) -> bool:
    layer = _layer_of(importer)
    assert layer is not None, importer
    if imported == layer or imported.startswith(layer + "."):
        return True
    return any(imported == a or imported.startswith(a + ".") for a in ALLOWED_OURS[layer])


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "ledger" and node.level == 0:
            # The namespace package holds nothing: ``from ledger import x`` imports ledger.x.
            found.update(f"ledger.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _module_name(path: Path, root: Path | None = None) -> str:
    parts = list(path.relative_to(root or ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _violations(package: str, forbidden_external: set[str]) -> list[str]:
    bad = []
    root = ROOT / package.replace(".", "/")
    paths = sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
    for path in paths:
        importer = _module_name(path)
        if _layer_of(importer) != package:
            continue  # a more specific layer inside this package checks it
        for name in _imports(path):
            top = name.split(".")[0]
            if top in OURS and not _allowed(importer, name):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
            for io in forbidden_external:
                if name == io or name.startswith(io + "."):
                    bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(ALLOWED_OURS))
def test_dependencies_point_inward(package: str) -> None:
    assert _violations(package, set()) == []


def test_every_product_module_belongs_to_a_layer() -> None:
    for package in ("domain", "ledger", "projections", "publisher"):
        for path in (ROOT / package).rglob("*.py"):
            name = _module_name(path)
            if name != "ledger":  # the namespace package itself holds nothing
                assert _layer_of(name) is not None, name


def test_domain_imports_no_io_module() -> None:
    assert _violations("domain", IO_MODULES) == []


def test_layering_check_catches_a_forbidden_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_root = tmp_path
    (fake_root / "domain").mkdir()
    (fake_root / "domain" / "bad.py").write_text("import sqlalchemy\nfrom ledger import db\n")
    (fake_root / "ledger" / "log").mkdir(parents=True)
    (fake_root / "ledger" / "log" / "bad.py").write_text("from projections.runner import x\n")
    (fake_root / "ledger" / "cli").mkdir(parents=True)
    (fake_root / "ledger" / "cli" / "bad.py").write_text("from ledger.log.db import x\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    assert len(_violations("domain", IO_MODULES)) == 2
    assert _violations("ledger.log", set()) == ["ledger/log/bad.py imports projections.runner"]
    assert _violations("ledger.cli", set()) == ["ledger/cli/bad.py imports ledger.log.db"]


def _command_class_bases(root: Path) -> list[str]:
    """Every class under ``ledger/commands`` that inherits from a class defined there
    (``module.Class inherits module.Base``): command classes take collaborators, never
    a mixin (issue 26). A result shape extending another (``TypedDict``) is data, not a
    command class, and is not counted."""
    package = root / "ledger" / "commands"
    trees = {
        ".".join(p.relative_to(root).with_suffix("").parts): ast.parse(p.read_text("utf-8"))
        for p in sorted(package.rglob("*.py"))
    }
    defined = {
        (module, node.name)
        for module, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    bases: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for module, tree in trees.items():
        imported: dict[str, tuple[str, str]] = {}  # local name -> (module, name)
        modules: dict[str, str] = {}  # local alias -> module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    local = alias.asname or alias.name
                    imported[local] = (node.module, alias.name)
                    modules[local] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    modules[alias.asname or alias.name] = alias.name
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            found = bases.setdefault((module, node.name), [])
            for base in node.bases:
                if isinstance(base, ast.Name):
                    found.append(imported.get(base.id, (module, base.id)))
                elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
                    found.append((modules.get(base.value.id, base.value.id), base.attr))
    shapes = {c for c, found in bases.items() if any(b[1] == "TypedDict" for b in found)}
    while grown := {c for c, found in bases.items() if set(found) & shapes} - shapes:
        shapes |= grown
    return [
        f"{c[0]}.{c[1]} inherits {b[0]}.{b[1]}"
        for c, found in bases.items()
        for b in found
        if b in defined and b not in shapes
    ]


def test_no_command_class_inherits_another_command_class() -> None:
    assert _command_class_bases(ROOT) == []


def test_mixin_check_catches_a_command_mixin(tmp_path: Path) -> None:
    package = tmp_path / "ledger" / "commands"
    package.mkdir(parents=True)
    (package / "core.py").write_text("class Core:\n    pass\n")
    (package / "apply.py").write_text(
        "from ledger.commands.core import Core\n"
        "from ledger.commands import core\n"
        "class Apply(Core):\n    pass\n"
        "class Again(core.Core):\n    pass\n"
        "class Fine(Exception):\n    pass\n"
        "class Local(Fine):\n    pass\n"
        "from typing import TypedDict\n"
        "class Shape(TypedDict):\n    a: int\n"
        "class Wider(Shape):\n    b: int\n"
    )
    assert _command_class_bases(tmp_path) == [
        "ledger.commands.apply.Apply inherits ledger.commands.core.Core",
        "ledger.commands.apply.Again inherits ledger.commands.core.Core",
        "ledger.commands.apply.Local inherits ledger.commands.apply.Fine",
    ]


# -- import cycles (issue 26) ------------------------------------------------------------------


def _product_modules(root: Path) -> dict[str, Path]:
    return {
        _module_name(path, root): path
        for package in sorted(OURS)
        if (root / package).is_dir()
        for path in sorted((root / package).rglob("*.py"))
    }


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(path: Path, modules: Mapping[str, Path]) -> set[str]:
    """Every product module ``path`` imports when it runs: at module level and inside
    functions alike (a function-level import is still a dependency), ``if TYPE_CHECKING:``
    blocks left out (they never run). ``from a import b`` names module ``a.b`` when that
    is a module, else ``a``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit_node(other)
                continue
            visit_node(child)

    def visit_node(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in modules else node.module)
        visit(node)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in modules}


def _import_cycles(root: Path) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    modules = _product_modules(root)
    graph = {m: sorted(_runtime_imports(p, modules) - {m}) for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(cycles)


def test_no_import_cycle_among_product_modules() -> None:
    """Declarations are built explicitly (the view registry, the store's metadata), so no
    module needs another that needs it back, not even from inside a function."""
    assert _import_cycles(ROOT) == []


def test_cycle_check_sees_function_level_imports_and_skips_type_checking(
    tmp_path: Path,
) -> None:
    (tmp_path / "projections").mkdir()
    (tmp_path / "projections" / "a.py").write_text("from projections.b import x\n")
    (tmp_path / "projections" / "b.py").write_text(
        "def f():\n    from projections import a\n    return a\n"
    )
    (tmp_path / "projections" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from projections import a\n"
    )
    (tmp_path / "projections" / "d.py").write_text("import projections.c\n")
    assert _import_cycles(tmp_path) == [["projections.a", "projections.b"]]


# -- module size (issue 26) --------------------------------------------------------------------

MAX_LINES = 600


def test_no_product_module_exceeds_600_lines() -> None:
    too_long = {
        str(path.relative_to(ROOT)): lines
        for path in _product_modules(ROOT).values()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert too_long == {}
