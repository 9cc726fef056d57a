"""Schema artifacts in schema/ are exactly what the code generates; identity columns are binary."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.store.init import ddl

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dialect", ["sqlite", "mysql"])
def test_r3_checked_in_ddl_matches_generated(dialect: str) -> None:
    checked_in = (ROOT / "schema" / f"{dialect}.sql").read_text(encoding="utf-8")
    assert checked_in == ddl(dialect), (
        f"schema/{dialect}.sql is stale: run `catalog-ledger schema dump` and commit the result"
    )


def test_r3_no_text_identity_columns_on_mysql() -> None:
    text = ddl("mysql")
    for forbidden in ("VARCHAR", "TEXT", "CHAR(", "AUTO_INCREMENT"):
        assert forbidden not in text, forbidden
