"""Crash sweep, full (make campaign): SIGKILL the release at every crash point."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Server
from tests.support.crash_support import sweep


@pytest.mark.campaign
@pytest.mark.parametrize("kind", ["sqlite", "mariadb"])
def test_r12_r20_sigkill_at_every_crash_point_converges(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server: Server | None = request.getfixturevalue("mysql_server") if kind == "mariadb" else None
    result = sweep(kind, tmp_path, server)
    print(
        f"\n[{kind}] crash points: {result.points}, killed: {result.killed}, converged "
        f"with the identical content digest: {result.exact_digest}, with a fresh "
        f"incarnation after recovery (R12): {result.fresh_incarnation}, failures: "
        f"{len(result.failures)}"
    )
    assert result.failures == []
    assert result.killed == result.points
