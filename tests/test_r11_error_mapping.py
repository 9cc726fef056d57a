"""R11: engine failures map onto typed errors — a lost race is CONFLICT, a transient
failure a retryable UNAVAILABLE, never an internal error.

The MariaDB cases are provoked for real on the server (a deadlock, which is also
how Galera reports a certification failure, and a lock wait timeout). TiDB's
error numbers cannot be produced by MariaDB, so those rows of the table are
checked on driver exceptions carrying exactly those numbers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pymysql
import pytest
import sqlalchemy as sa

from domain.errors import Conflict, Unavailable
from ledger.log.db import Database, open_database, translate, translate_errors
from ledger.store.init import init_store


@pytest.fixture
def mariadb(mysql_url: str) -> Iterator[Database]:
    db = open_database(mysql_url)
    init_store(db)
    with db.engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO ledger_meta (name, value) VALUES ('a', 'x'), ('b', 'x')")
    yield db
    db.close()


def _lock(conn: sa.Connection, name: str) -> None:
    conn.exec_driver_sql(f"SELECT value FROM ledger_meta WHERE name = '{name}' FOR UPDATE")


def test_r11_a_deadlock_is_a_conflict(mariadb: Database) -> None:
    """1213: InnoDB's deadlock victim, and Galera's certification failure."""
    outcomes: list[BaseException | None] = [None, None]
    both_hold = threading.Barrier(2)

    def cross(index: int, first: str, second: str) -> None:
        try:
            with translate_errors(), mariadb.engine.connect() as conn, conn.begin():
                _lock(conn, first)
                both_hold.wait(60)
                _lock(conn, second)
        except BaseException as exc:
            outcomes[index] = exc

    threads = [
        threading.Thread(target=cross, args=(0, "a", "b")),
        threading.Thread(target=cross, args=(1, "b", "a")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    failed = [o for o in outcomes if o is not None]
    assert len(failed) == 1, outcomes  # the victim; the other transaction goes on
    assert isinstance(failed[0], Conflict) and failed[0].details["errno"] == 1213


def test_r11_a_lock_wait_timeout_is_a_retryable_unavailable(mariadb: Database) -> None:
    with mariadb.engine.connect() as holder, holder.begin():
        _lock(holder, "a")
        with (
            pytest.raises(Unavailable) as info,
            translate_errors(),
            mariadb.engine.connect() as waiter,
            waiter.begin(),
        ):
            waiter.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1")
            _lock(waiter, "a")
    assert (info.value.details["errno"], info.value.details["retryable"]) == (1205, True)
    assert info.value.exit_code == 1


@pytest.mark.parametrize(
    ("errno", "kind", "retryable"),
    [
        (9007, Conflict, None),  # TiDB write conflict
        (8002, Conflict, None),  # TiDB: SELECT FOR UPDATE cannot be retried
        (8022, Conflict, None),  # TiDB: optimistic transaction retry failed
        (1213, Conflict, None),  # deadlock / Galera certification failure
        (1062, Conflict, None),  # duplicate key: a concurrent append won
        (8028, Unavailable, True),  # TiDB: information schema changed (after DDL)
        (1205, Unavailable, True),  # lock wait timeout
        (2013, Unavailable, None),  # lost connection: not known to be retryable
    ],
)
def test_r11_engine_error_numbers_map_to_typed_errors(
    errno: int, kind: type, retryable: bool | None
) -> None:
    error = translate(pymysql.err.OperationalError(errno, f"server said {errno}"))
    assert type(error) is kind
    assert error.details["errno"] == errno
    assert error.details.get("retryable") is retryable
