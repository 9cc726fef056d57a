"""Release histories, full (make campaign): ``tests/rules/test_r30_release_histories.py``
with many more examples and longer histories, fresh random ones each run (the ``explore``
profile), failing histories shrunk, on SQLite files and on MariaDB.

``CATALOG_LEDGER_HISTORY_EXAMPLES`` (default 60) and ``CATALOG_LEDGER_HISTORY_STEPS``
(default 40) size the run; what it exercised is printed at the end.
"""

from __future__ import annotations

import os

import pytest

from tests.rules.test_r30_release_histories import Stores, run_histories, stores

EXAMPLES = int(os.environ.get("CATALOG_LEDGER_HISTORY_EXAMPLES", "60"))
STEPS = int(os.environ.get("CATALOG_LEDGER_HISTORY_STEPS", "40"))

__all__ = ["stores"]


@pytest.mark.campaign
def test_r30_release_histories_publish_what_the_full_rebuild_publishes_full(
    stores: Stores,
) -> None:
    stats = run_histories(stores, examples=EXAMPLES, steps=STEPS, shrink=True)
    print(f"\n[release histories {stores.engine}] {stats.summary()}")
    assert stats.examples >= EXAMPLES
    assert stats.publications["apply"] > stats.examples and stats.publications["publish"] > 0
    assert sum(stats.kept.values()) > 0
