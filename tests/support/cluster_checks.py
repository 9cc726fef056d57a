"""What every node of a cluster must agree on once writers have raced on it (R10, R12, R20-R22).

``settle`` waits until every node has applied the same log head (Galera applies a
certified write set on the other nodes a moment after the writer's commit
returns); ``node_report`` audits one node through the public API — chain, event
ids and Merkle root (``audit verify``, which raises INTEGRITY on any problem),
views against a fresh replay (``projections verify``), gapless positions — and
lists the activation epochs and command records its log holds.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from domain.event_types import EVENT_TYPES
from ledger.api import open_store
from ledger.log.db import open_database
from ledger.log.recorder import LedgerRecorder


@dataclass(frozen=True)
class NodeReport:
    """One node's log as an auditor sees it."""

    url: str
    size: int
    root: str
    chain: str
    revisions: int
    gapless: bool
    views: list[str]
    #: pack -> activation epochs in log order (one winner per epoch: 1, 2, 3, ...).
    epochs: dict[str, list[int]]
    #: command id -> recorded result (R10 idempotency records).
    commands: dict[str, dict[str, Any]]
    #: The reason of every failed generation (``activation refused: CONFLICT: ...`` is
    #: a candidate whose final append lost a race and was re-decided).
    failed: list[str]

    def agreed(self) -> tuple[int, str, str, int]:
        """What every node must report identically."""
        return (self.size, self.root, self.chain, self.revisions)


def head_of(url: str) -> tuple[int, bytes]:
    db = open_database(url, create=False)
    try:
        head = LedgerRecorder(db).head()
        return head.position, head.chain
    finally:
        db.close()


def settle(urls: Sequence[str], timeout: float = 60.0) -> int:
    """Wait until every node reports the same head twice in a row; return its position."""
    deadline = time.monotonic() + timeout
    previous: set[tuple[int, bytes]] = set()
    while True:
        heads = {head_of(url) for url in urls}
        if len(heads) == 1 and heads == previous:
            return next(iter(heads))[0]
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"the nodes did not settle on one head within {timeout} s: {heads}"
            )
        previous = heads
        time.sleep(0.3)


def node_report(url: str) -> NodeReport:
    """Audit one node (INTEGRITY raises) and describe its log."""
    with open_store(url) as store:
        audit = store.audit()
        checked = store.verify_projections()
        rows = list(store.ledger.recorder.iter_rows())
    epochs: dict[str, list[int]] = {}
    commands: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    for row in rows:
        name, data = EVENT_TYPES.decode(row.topic, row.state)
        if name.startswith("activation.") and data.get("epoch") is not None:
            epochs.setdefault(str(data["pack"]), []).append(int(data["epoch"]))
        elif name == "command.recorded":
            commands[str(data["command_id"])] = dict(data["result"])
        elif name == "generation.failed":
            failed.append(str(data.get("reason", "")))
    return NodeReport(
        url=url,
        size=audit.size,
        root=base64.b64encode(audit.root).decode(),
        chain=audit.chain.hex(),
        revisions=audit.revisions,
        gapless=[r.position for r in rows] == list(range(1, len(rows) + 1)),
        views=[v["name"] for v in checked["views"] if v["ok"]],
        epochs=epochs,
        commands=commands,
        failed=failed,
    )


def one_winner_per_epoch(epochs: dict[str, list[int]]) -> bool:
    """Every pack's activation moved 1, 2, 3, ... with no epoch taken twice or skipped."""
    return all(found == list(range(1, len(found) + 1)) for found in epochs.values())
