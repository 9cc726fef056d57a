"""Concurrent writers, full (make campaign): 2, 4 and 8 processes for a minute each."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.concurrency_support import race

SECONDS = float(os.environ.get("CATALOG_LEDGER_CAMPAIGN_SECONDS", "60"))


@pytest.mark.campaign
@pytest.mark.parametrize("engine_url", ["mariadb"], indirect=True)
@pytest.mark.parametrize("writers", [2, 4, 8])
def test_r12_racing_writers_leave_a_verifiable_log(
    engine_url: str, tmp_path: Path, writers: int
) -> None:
    outcome = race(engine_url, tmp_path / "work", writers, seconds=SECONDS)
    print(
        f"\n[{writers} writers, {SECONDS:.0f} s] {outcome['counts']}; events "
        f"{outcome['events']}, revisions {outcome['revisions']}, audit ok "
        f"{outcome['audit_ok']}"
    )
    assert outcome["errors"] == []
    assert outcome["gapless"] and outcome["chain_ok"]
    assert outcome["audit_ok"], outcome["audit_first"]
