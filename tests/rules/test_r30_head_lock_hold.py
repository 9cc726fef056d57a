"""R30's measurement of the head lock: every committed append records how long it held
the head row, from locking it to the commit (``ledger.log.append.HeadLockHolds``), on
SQLite and MariaDB. No figure's size is asserted: only that it is recorded, per append,
over the span the lock is held, and not for an append that was refused."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from uuid import uuid4

import pytest
from eventsourcing.persistence import StoredEvent
from sqlalchemy import event
from sqlalchemy.engine import Connection

from domain.errors import Conflict
from domain.log import LoggedEvent
from ledger.log.db import Database
from ledger.log.recorder import LedgerRecorder


def test_r30_each_committed_append_records_its_head_lock_hold(db: Database) -> None:
    recorder = LedgerRecorder(db)
    holds = recorder.head_lock_holds
    assert (holds.last, holds.count, holds.total, holds.longest) == (None, 0, 0.0, 0.0)
    agg = uuid4()

    recorder.insert_events([StoredEvent(agg, v, "note.added v1", b"{}") for v in (1, 2, 3)])
    first = holds.last
    assert isinstance(first, float) and first > 0
    assert (holds.count, holds.total, holds.longest) == (1, first, first)

    recorder.insert_events([StoredEvent(agg, 4, "note.added v1", b"{}")])
    second = holds.last
    assert isinstance(second, float) and second > 0
    assert holds.count == 2
    assert holds.total == first + second  # the second overwrote last, added to the total
    assert holds.longest == max(first, second)

    with pytest.raises(Conflict):  # version 4 again: refused, nothing recorded
        recorder.insert_events([StoredEvent(agg, 4, "note.added v1", b"{}")])
    assert (holds.last, holds.count, holds.total) == (second, 2, first + second)

    holds.reset()
    assert (holds.last, holds.count, holds.total, holds.longest) == (None, 0, 0.0, 0.0)
    recorder.insert_events([StoredEvent(agg, 5, "note.added v1", b"{}")])
    assert holds.count == 1 and holds.last is not None and holds.last > 0


def test_r30_the_hold_runs_from_the_locked_head_past_the_precommit_and_views_to_commit(
    db: Database,
) -> None:
    """On a clock that ticks once per reading (injected), the append reads it once the
    head row is locked, before the ``precommit`` (run on the locked head) and the inline
    views, and again after the commit began: the hold is the ticks between."""
    ticks = itertools.count(1)
    marks: dict[str, float] = {}

    def clock() -> float:
        return float(next(ticks))

    def precommit(conn: Connection) -> None:
        marks["precommit"] = clock()

    def hook(conn: Connection, rows: Sequence[LoggedEvent]) -> None:
        marks["views"] = clock()
        event.listen(conn, "commit", lambda _: marks.setdefault("commit", clock()), once=True)

    recorder = LedgerRecorder(db, inline_hooks=[hook])
    recorder.head_lock_holds.clock = clock
    recorder.append([StoredEvent(uuid4(), 1, "note.added v1", b"{}")], precommit=precommit)
    # 1: head locked, 2: precommit, 3: views, 4: commit begins, 5: committed.
    assert marks == {"precommit": 2.0, "views": 3.0, "commit": 4.0}
    assert recorder.head_lock_holds.last == 5.0 - 1.0
    assert next(ticks) == 6  # no other reading
