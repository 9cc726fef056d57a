"""The benchmarks' own plumbing (issue 25.8): ``make bench`` runs them, and the benches
that speak no HTTP do not need httpx installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
