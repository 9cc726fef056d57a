"""DESIGN layering: `domain` stays pure; dependencies point inward."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
ALLOWED_OURS = {
    "domain": set(),
    "publisher": {"domain"},
    "projections": {"domain"},
    "ledger": {"domain", "projections", "publisher"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _violations(package: str, forbidden_external: set[str]) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            if top in OURS and top != package and top not in ALLOWED_OURS[package]:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
            for io in forbidden_external:
                if name == io or name.startswith(io + "."):
                    bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(ALLOWED_OURS))
def test_dependencies_point_inward(package: str) -> None:
    assert _violations(package, set()) == []


def test_domain_imports_no_io_module() -> None:
    assert _violations("domain", IO_MODULES) == []


def test_layering_check_catches_a_forbidden_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_root = tmp_path
    (fake_root / "domain").mkdir()
    (fake_root / "domain" / "bad.py").write_text("import sqlalchemy\nfrom ledger import db\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    assert len(_violations("domain", IO_MODULES)) == 2
