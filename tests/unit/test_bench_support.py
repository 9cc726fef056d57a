"""The benchmarks' own plumbing (issue 25.8): ``make bench`` runs them, and the benches
that speak no HTTP do not need httpx installed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import target_met

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


def test_r30_bench_apply_bounds_follow_issue_27() -> None:
    """The first release's bound is (N2 log N2)/(N1 log N1), 112 as issue 27 writes it
    for 250 -> 16000; a growth exponent is log(t2/t1)/log(N2/N1)."""
    from bench import apply as bench_apply

    assert bench_apply.n_log_n_bound(250, 16000) == 112.0
    assert abs(16000 * math.log(16000) / (250 * math.log(250)) - 112.0) < 0.5
    assert abs(bench_apply.n_log_n_bound(10, 100) - 20.0) < 1e-9
    assert abs(bench_apply.growth(1.0, 4.0, 250, 1000) - 1.0) < 1e-9
    assert abs(bench_apply.growth(2.0, 2.0, 250, 16000)) < 1e-9


def test_r30_bench_apply_prints_every_figure_and_bound_per_size_on_sqlite() -> None:
    """Issue 27.8: ``bench.apply --among`` measures, per N, the first release (with its
    peak RSS), the 1-pack release with its head-lock hold, the no-op re-apply (expected,
    not an error) and the manifest-parse peer, then the growth exponents and the four
    bounds, each PASS or MISS, each a SUMMARY line with its target."""
    args = ["--among", "2,4", "--engines", "sqlite", "--repeat", "1"]
    out = subprocess.run(
        [sys.executable, "-m", "bench.apply", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [
        json.loads(line.removeprefix("SUMMARY "))
        for line in out.stdout.splitlines()
        if line.startswith("SUMMARY ")
    ]
    by_figure = {row["figure"]: row for row in rows}
    for n in (2, 4):
        assert f"N={n} " in out.stdout
        for figure in (
            f"first release of {n} packs (fresh store)",
            f"first release of {n} packs: peak RSS",
            f"release changing 1 pack among {n}",
            f"head-lock hold, longest append of the 1-pack release among {n}",
            f"head-lock hold, sum over the 1-pack release's appends among {n}",
            f"no-op re-apply among {n}",
        ):
            assert by_figure[figure]["engine"] == "sqlite"
            assert by_figure[figure]["value"] > 0, figure
        assert by_figure[f"no-op re-apply among {n}"]["peer"] == f"manifest parse alone ({n} packs)"
    assert "growth exponents" in out.stdout and "2->4" in out.stdout
    bounds = [
        "1-pack release among 4",
        "no-op re-apply among 4",
        "head-lock hold (longest) among 4",
        "first release t(4)/t(2)",
    ]
    verdicts = [
        line.split(maxsplit=1)
        for line in out.stdout.splitlines()
        if line.lstrip().startswith(("PASS ", "MISS "))
    ]
    assert all(rest.startswith(bound) for (_, rest), bound in zip(verdicts, bounds, strict=True))
    for (verdict, _), bound in zip(verdicts, bounds, strict=True):
        row = by_figure[f"bound: {bound} (2 -> 4)"]
        assert row["target"].startswith("value<=") and row["peer"] == "bound"
        assert target_met(row) is (row["value"] <= row["peer_value"])
        assert verdict == ("PASS" if target_met(row) else "MISS")
