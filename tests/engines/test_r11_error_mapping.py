"""R11: engine failures map onto typed errors — a lost race is CONFLICT, a transient
failure a retryable UNAVAILABLE, a refused account PERMISSION (exit 7), never an
internal error.

The MariaDB cases are provoked for real on the server (a deadlock, which is also
how Galera reports a certification failure, and a lock wait timeout). TiDB's
error numbers cannot be produced by MariaDB, so those rows of the table are
checked on driver exceptions carrying exactly those numbers.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pymysql
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from domain.errors import Conflict, Permission, Unavailable
from ledger.log.db import Database, open_database, translate, translate_errors
from ledger.store.init import init_store
from tests.conftest import Server
from tests.support.cli_inprocess import cli_json


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
        (1142, Permission, None),  # table command denied to the account
        (1143, Permission, None),  # column command denied
        (1044, Permission, None),  # access denied to the database
        (1045, Permission, None),  # login refused (wrong user or password)
        (1698, Permission, None),  # login refused (unknown account, or a plugin's login)
        (1227, Permission, None),  # a privilege (SUPER, ...) missing
    ],
)
def test_r11_engine_error_numbers_map_to_typed_errors(
    errno: int, kind: type, retryable: bool | None
) -> None:
    error = translate(pymysql.err.OperationalError(errno, f"server said {errno}"))
    assert type(error) is kind
    assert error.details["errno"] == errno
    assert error.details.get("retryable") is retryable


@contextmanager
def account(server: Server, database_url: str, grant: str | None) -> Iterator[str]:
    """A real MariaDB account of its own (unique name) holding only ``grant`` on the
    database of ``database_url``: the URL it connects with. Dropped after."""
    name, password = "cl_" + secrets.token_hex(5), secrets.token_hex(8)
    database = make_url(database_url).database
    with server.connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE USER '{name}'@'%' IDENTIFIED BY '{password}'")
        if grant is not None:
            cur.execute(f"GRANT {grant} ON `{database}`.* TO '{name}'@'%'")
    try:
        url = make_url(database_url).set(username=name, password=password)
        yield url.render_as_string(hide_password=False)
    finally:
        with server.connect() as conn, conn.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{name}'@'%'")


def _head(db: Database) -> tuple[int, int]:
    with db.engine.connect() as conn:
        position = conn.exec_driver_sql("SELECT position FROM ledger_head").scalar_one()
        events = conn.exec_driver_sql("SELECT COUNT(*) FROM ledger_events").scalar_one()
    return int(position), int(events)


def test_r11_a_write_by_a_select_only_account_is_permission_exit_7(
    mariadb: Database, mysql_server: Server, mysql_url: str
) -> None:
    """1142 (INSERT/UPDATE command denied): the account may read, not write."""
    before = _head(mariadb)
    with account(mysql_server, mysql_url, "SELECT") as url:
        code, status = cli_json("--db", url, "status")
        assert code == 0 and status["head"] == before[0]  # reading is granted
        code, error = cli_json("--db", url, "credentials", "issue", "integration:a")
        assert (code, error["error"]) == (7, "PERMISSION"), error
        assert error["details"]["errno"] == 1142, error
        assert "command denied" in error["message"], error
    assert _head(mariadb) == before  # nothing written


def test_r11_a_wrong_password_is_permission_exit_7(
    mariadb: Database, mysql_server: Server, mysql_url: str
) -> None:
    """1045: the server is up and refuses the login; not UNAVAILABLE "server down"."""
    with account(mysql_server, mysql_url, "ALL") as url:
        wrong = make_url(url).set(password="not-" + (make_url(url).password or ""))
        code, error = cli_json("--db", wrong.render_as_string(hide_password=False), "status")
    assert (code, error["error"]) == (7, "PERMISSION"), error
    assert error["details"]["errno"] == 1045, error
    assert "Access denied" in error["message"], error
    assert "not-" not in str(error)  # the password is never printed


def test_r11_an_account_the_server_does_not_know_is_permission_exit_7(
    mariadb: Database, mysql_url: str
) -> None:
    """MariaDB refuses a user it has no account for with 1698 (or 1045): the server is
    up and refuses the login, PERMISSION, never UNAVAILABLE "server down"."""
    stranger = make_url(mysql_url).set(username="nobody-r11-unknown", password="pw")
    code, error = cli_json("--db", stranger.render_as_string(hide_password=False), "status")
    assert (code, error["error"]) == (7, "PERMISSION"), error
    assert error["details"]["errno"] in (1045, 1698), error
    assert "Access denied" in error["message"], error


def test_r11_an_account_without_grants_on_the_database_is_permission_exit_7(
    mariadb: Database, mysql_server: Server, mysql_url: str
) -> None:
    """1044: the login works, the database is not this account's."""
    with account(mysql_server, mysql_url, None) as url:
        code, error = cli_json("--db", url, "status")
    assert (code, error["error"]) == (7, "PERMISSION"), error
    assert error["details"]["errno"] == 1044, error
