"""Concurrent writers on MariaDB, fast subset (R8, R12, R16-R22): processes racing apply of
different manifests, publish and projections rebuild; afterwards positions are gapless,
the chain verifies, every epoch had one winner and every revision bound only generations
active at its position (audit replay), and every view equals a replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.concurrency_support import race


@pytest.mark.parametrize("engine_url", ["mariadb"], indirect=True)
# Four writers run in `make campaign` (with tests/campaigns/test_concurrency_full.py).
@pytest.mark.parametrize("writers", [2, pytest.param(4, marks=pytest.mark.campaign)])
def test_r12_racing_writers_leave_a_verifiable_log(
    engine_url: str, tmp_path: Path, writers: int
) -> None:
    # 6 s of racing (the campaign variant races 2, 4 and 8 writers for a minute each).
    outcome = race(engine_url, tmp_path / "work", writers, seconds=6)
    assert outcome["errors"] == []
    assert outcome["gapless"] and outcome["chain_ok"]
    assert outcome["audit_ok"], outcome["audit_first"]
    counts = outcome["counts"]
    assert counts.get("apply:ok", 0) >= 1
    assert outcome["revisions"] >= 1
