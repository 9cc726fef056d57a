"""SQLite write transactions reuse idle connections, and a failed one writes nothing
and gives its connection up (R11).

``Database.write`` keeps a few write connections idle between transactions (a pool
checkout and a connection object per commit cost more than the commit's own work
outside the fsync). These tests pin what that must not change: a transaction that
fails leaves nothing behind and the next starts on a fresh connection, threads that
come and go pin none, a disposed pool's connection is not reused, and ``close``
closes them all.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from eventsourcing.persistence import StoredEvent

from domain.errors import Conflict
from domain.log import first_chain_break
from ledger.log.db import IDLE_WRITES, Database, open_database
from ledger.log.recorder import LedgerRecorder
from ledger.store.init import init_store


def _driver(db: Database) -> Any:
    with db.write() as conn:
        return conn.connection.dbapi_connection


def _event(aggregate: Any, version: int) -> StoredEvent:
    return StoredEvent(
        originator_id=aggregate, originator_version=version, topic="t:Created", state=b"{}"
    )


@pytest.fixture
def db(tmp_path: Path) -> Any:
    opened = open_database(f"sqlite:///{tmp_path / 'store.db'}")
    init_store(opened)
    yield opened
    opened.close()


def test_r11_sqlite_writes_reuse_an_idle_connection(db: Database) -> None:
    assert _driver(db) is _driver(db)


def test_r11_threads_that_come_and_go_pin_no_write_connection(db: Database) -> None:
    """Connections go back after each transaction, not to a thread: 40 short-lived
    writer threads leave no more than the few idle ones checked out."""
    recorder = LedgerRecorder(db)
    for _ in range(40):
        thread = threading.Thread(target=lambda: recorder.append([_event(uuid4(), 1)]))
        thread.start()
        thread.join()
    assert recorder.head().position == 40
    assert db.engine.pool.checkedout() <= IDLE_WRITES  # type: ignore[attr-defined]


def test_r11_a_write_after_the_pool_was_disposed_uses_a_new_connection(db: Database) -> None:
    """``engine.dispose()`` (init runs it after DDL) means later work reconnects: an idle
    write connection of the old pool is closed, not reused."""
    before = _driver(db)
    db.engine.dispose()
    after = _driver(db)
    assert after is not before
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        before.execute("SELECT 1")


def test_r11_a_failed_write_rolls_back_and_the_next_starts_on_a_fresh_connection(
    db: Database,
) -> None:
    recorder = LedgerRecorder(db)
    aggregate = uuid4()
    recorder.append([_event(aggregate, 1)])
    before = _driver(db)
    with pytest.raises(RuntimeError), db.write() as conn:
        conn.exec_driver_sql("UPDATE ledger_head SET position = 99 WHERE id = 1")
        raise RuntimeError("the caller failed mid-transaction")
    assert recorder.head().position == 1  # rolled back
    assert _driver(db) is not before
    recorder.append([_event(aggregate, 2)])
    rows = list(recorder.iter_rows())
    assert [r.version for r in rows] == [1, 2]
    assert first_chain_break(rows) is None


def test_r11_a_conflicting_append_writes_nothing_and_the_next_append_succeeds(
    db: Database,
) -> None:
    recorder = LedgerRecorder(db)
    aggregate = uuid4()
    recorder.append([_event(aggregate, 1)])
    with pytest.raises(Conflict):
        recorder.append([_event(uuid4(), 1), _event(aggregate, 1)])  # collides on row 2
    assert recorder.head().position == 1
    assert [r.version for r in recorder.iter_rows()] == [1]
    recorder.append([_event(aggregate, 2)])
    assert recorder.head().position == 2
    assert first_chain_break(list(recorder.iter_rows())) is None


def test_r11_close_closes_every_held_write_connection(tmp_path: Path) -> None:
    db = open_database(f"sqlite:///{tmp_path / 'store.db'}")
    init_store(db)
    mine = _driver(db)
    theirs: list[Any] = []
    thread = threading.Thread(target=lambda: theirs.append(_driver(db)))
    thread.start()
    thread.join()
    db.close()
    for driver in (mine, theirs[0]):
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            driver.execute("SELECT 1")
