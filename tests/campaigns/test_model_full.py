"""Lifecycle model check, full (make campaign): the state machine of ``tests/rules/test_model.py``
with many more examples and longer runs, on SQLite files and on MariaDB.

``CATALOG_LEDGER_MODEL_EXAMPLES`` (default 200) and ``CATALOG_LEDGER_MODEL_STEPS``
(default 60) size the run; what it exercised is printed at the end.
"""

from __future__ import annotations

import os

import pytest

from tests.rules.test_model import Harness, harness, run_model

EXAMPLES = int(os.environ.get("CATALOG_LEDGER_MODEL_EXAMPLES", "200"))
STEPS = int(os.environ.get("CATALOG_LEDGER_MODEL_STEPS", "60"))

__all__ = ["harness"]


@pytest.mark.campaign
def test_r6_r17_lifecycle_model_agrees_with_the_store_full(
    harness: Harness, engine_url: str
) -> None:
    stats = run_model(harness, examples=EXAMPLES, steps=STEPS)
    print(f"\n[model {engine_url.split(':', 1)[0]}] {stats.summary()}")
    for outcome, count in sorted(stats.outcomes.items()):
        print(f"  {count:6d}  {outcome}")
    assert stats.examples >= EXAMPLES and any(k.endswith(" ok") for k in stats.outcomes)
    assert any(" rejected" in k for k in stats.outcomes)
