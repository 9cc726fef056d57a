"""The benchmarks' own plumbing (issue 25.8): ``make bench`` runs them, and the benches
that speak no HTTP do not need httpx installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_bench_common_imports_without_httpx() -> None:
    # A fresh interpreter: whether bench.common pulls httpx in at import time.
    probe = "import sys, bench.common; print('httpx' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_make_bench_runs_bench_all_quick() -> None:
    # -n: print the recipe, run nothing (the stamp may make it list the install too).
    out = subprocess.run(
        ["make", "-n", "bench"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "-m bench.all --quick" in out.stdout


def test_bench_cli_runs_in_bench_all_with_each_peer_on_cached_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25.7: ``bench.cli`` is one of ``make bench``'s benches, alternates each
    command with ``python -c pass`` (the floor) and times both in one environment: no
    CATALOG_LEDGER_* setting, and bytecode cached in the bench's own folder (as an
    installed package has it) unless --no-bytecode-cache keeps the caller's."""
    from bench import all as bench_all
    from bench import cli as bench_cli

    assert "cli" in [name for name, *_ in bench_all.BENCHES]
    assert [name for name, *_ in bench_cli.COMMANDS] == ["version", "help", "status", "view"]
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("CATALOG_LEDGER_DB", "sqlite:///elsewhere.db")
    cached = bench_cli.environment(tmp_path / "pycache")
    as_given = bench_cli.environment(None)
    assert cached["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache")
    assert "PYTHONDONTWRITEBYTECODE" not in cached
    assert as_given["PYTHONDONTWRITEBYTECODE"] == "1" and "PYTHONPYCACHEPREFIX" not in as_given
    assert not any(k.startswith("CATALOG_LEDGER_") for k in (*cached, *as_given))
