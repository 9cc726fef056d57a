"""Crash sweep, fast subset (R8, R12, R16, R20, R22): SIGKILL a release at sampled crash
points — append boundaries and inside append transactions — then check the log, the
views, recovery and convergence. The full sweep is tests/campaigns/test_crash_full.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Server
from tests.support.crash_support import sweep


# The MariaDB sample runs in `make campaign` beside the full sweep of both engines;
# the default run keeps SQLite (same code path above the engine), within its time budget.
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("mariadb", marks=pytest.mark.campaign)])
def test_r12_r20_sigkill_at_sampled_crash_points_converges(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server: Server | None = request.getfixturevalue("mysql_server") if kind == "mariadb" else None
    # Every 9th point from the 2nd: all five kinds of point (begin, head locked, rows
    # inserted, before commit, committed) across different commands of the sequence.
    result = sweep(kind, tmp_path, server, points=list(range(2, 400, 9)))
    assert result.failures == []
    assert result.killed >= 8
    # Kills between a prepare and its activation converge on a fresh incarnation; every
    # other kill converges on the uninterrupted run's exact digest (checked per point).
    assert result.exact_digest >= 1 and result.fresh_incarnation >= 1, result
    assert result.exact_digest + result.fresh_incarnation == result.killed
