"""The rule index in tests/README.md is complete and true: every rule R1-R30 has an entry
(or is pending with its issue), every listed file and test function exists, and every rule
not pending has a test named for it (``test_rN_…``) somewhere in the suite."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "tests" / "README.md"
RULES = range(1, 31)
ENTRY = re.compile(r"^- \*\*R(\d+)\*\*")
PENDING = re.compile(r"pending — issue: .+ \(R(\d+)\)")


def index_entries(text: str) -> dict[int, str]:
    """The rule index section: rule number -> the entry's text (continuation lines joined)."""
    section = text.split("## Rule index", 1)[1].split("\n## ", 1)[0]
    entries: dict[int, str] = {}
    current: int | None = None
    for line in section.splitlines():
        match = ENTRY.match(line)
        if match:
            current = int(match.group(1))
            assert current not in entries, f"R{current} has two entries in tests/README.md"
            entries[current] = line
        elif current is not None and line.startswith("  "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def references(entry: str) -> list[tuple[str, str | None]]:
    """(file, function or None) for every backticked name; a function belongs to the file
    named before it."""
    refs: list[tuple[str, str | None]] = []
    file: str | None = None
    for token in re.findall(r"`([^`]+)`", entry):
        if token.endswith(".py"):
            file = token
            refs.append((file, None))
        else:
            assert file is not None, f"{token} is listed before any file"
            refs.append((file, token))
    return refs


@cache
def functions_in(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def suite_files() -> list[Path]:
    return sorted(p for p in (ROOT / "tests").rglob("test_*.py") if "fixtures" not in p.parts)


def rules_named(function: str) -> set[int]:
    """The rules a test's name says it proves: ``test_r11_r12_…`` -> {11, 12}."""
    match = re.match(r"test_((?:r\d+_)+)", function)
    return {int(n) for n in re.findall(r"r(\d+)_", match.group(1))} if match else set()


def named_rules() -> set[int]:
    return {rule for path in suite_files() for f in functions_in(path) for rule in rules_named(f)}


ENTRIES = index_entries(README.read_text(encoding="utf-8"))


def test_every_rule_has_one_entry_and_no_other_rule_is_listed() -> None:
    assert sorted(ENTRIES) == list(RULES)


@pytest.mark.parametrize("rule", RULES, ids=[f"R{r}" for r in RULES])
def test_every_rule_is_pending_with_its_issue_or_lists_proofs_that_exist(rule: int) -> None:
    entry = ENTRIES[rule]
    pending = PENDING.search(entry)
    refs = references(entry)
    if pending:
        assert int(pending.group(1)) == rule, f"R{rule}: pending names another rule's issue"
        return
    assert refs, f"R{rule} lists no test and is not marked pending"
    for file, function in refs:
        path = ROOT / file
        assert path.is_file(), f"R{rule}: {file} does not exist"
        if function is not None:
            assert function.startswith("test_"), f"R{rule}: {function} is not a test"
            assert function in functions_in(path), f"R{rule}: {file} has no {function}"


@pytest.mark.parametrize("rule", RULES, ids=[f"R{r}" for r in RULES])
def test_every_rule_not_pending_has_a_test_named_for_it(rule: int) -> None:
    if PENDING.search(ENTRIES[rule]):
        return
    assert rule in named_rules(), f"no test anywhere is named test_r{rule}_…"


def test_the_index_check_catches_a_missing_rule_a_wrong_function_and_an_unnamed_rule() -> None:
    broken = index_entries(
        "## Rule index\n\n- **R1** x —\n  `tests/unit/test_rule_index.py`: `test_nowhere`\n"
    )
    assert sorted(broken) != list(RULES)
    ((file, _), (_, function)) = references(broken[1])
    assert function not in functions_in(ROOT / file)
    assert rules_named("test_r11_r12_x") == {11, 12} and rules_named("test_x_r3_y") == set()
    assert PENDING.search("- **R29** x — pending — issue: Verifiable reads (R29)")
