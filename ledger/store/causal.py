"""Causal reads on a Galera node: wait until it has applied what the cluster committed.

Galera certifies a write set on every node at commit but applies it on the others a
moment later, so a read on another node may not yet see it. Deciding writes never
needs to wait (a decision made on old state is fenced and made again), but the checks
every command makes on opening a store do: ``init`` through one node, then a command
through another, must find the schema, not tables without their version row (which
would read as an edited store) or no tables at all.

``catch_up`` makes one causal read per opened store (``wsrep_sync_wait`` for that
statement's session, set and restored around it): once it returns, the node has applied
every write set the cluster committed before it, so every later read on that node, on
any connection, sees them; later calls on the same store return at once. Elsewhere
(SQLite, MariaDB or MySQL without Galera) it costs one query per opened store, or none.
"""

from __future__ import annotations

import weakref

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from domain.errors import Unavailable
from ledger.log.db import Database, translate_errors

#: MySQL's "unknown system variable": a server without Galera's variables.
_UNKNOWN_VARIABLE = 1193
#: MySQL's "lock wait timeout exceeded", which a causal read that timed out reports.
_LOCK_WAIT_TIMEOUT = 1205

#: The write engines of the stores that have caught up (or need not: not Galera).
_CAUGHT_UP: weakref.WeakSet[Engine] = weakref.WeakSet()


def catch_up(db: Database) -> None:
    """Return once the node behind ``db`` has applied what the cluster committed before.

    A node that cannot catch up within Galera's ``repl.causal_read_timeout`` (held by a
    backup's lock, or far behind) is UNAVAILABLE, named as such: retry, or use another
    node.
    """
    if db.is_sqlite or db.engine in _CAUGHT_UP:
        return
    with translate_errors(), db.engine.connect() as conn:
        previous = _galera_sync_wait(conn)
        if previous is not None:
            _wait(conn, db, previous)
    _CAUGHT_UP.add(db.engine)


def _wait(conn: Connection, db: Database, previous: int) -> None:
    """One causal ``SELECT 1``; the session's setting is restored after it, or the
    connection is discarded (never pooled with the setting left on)."""
    conn.rollback()  # a causal wait is skipped inside an open transaction
    conn.exec_driver_sql("SET SESSION wsrep_sync_wait = 1")
    try:
        conn.exec_driver_sql("SELECT 1").scalar()
    except sa.exc.DBAPIError as exc:
        if _errno(exc) != _LOCK_WAIT_TIMEOUT:
            raise
        raise Unavailable(
            "this Galera node did not catch up with the cluster within its causal-read "
            "timeout (repl.causal_read_timeout): it is behind or paused; retry, or use "
            "another node",
            url=db.display_url,
            retryable=True,
        ) from None
    finally:
        _restore(conn, previous)


def _restore(conn: Connection, previous: int) -> None:
    """Set the session's ``wsrep_sync_wait`` back; on any failure drop the connection
    instead, so that the error being raised (or the interrupt) stays the one reported."""
    if conn.invalidated:
        return
    try:
        conn.rollback()
        conn.exec_driver_sql(f"SET SESSION wsrep_sync_wait = {previous}")
    except sa.exc.DBAPIError:
        conn.invalidate()


def _galera_sync_wait(conn: Connection) -> int | None:
    """This session's ``wsrep_sync_wait`` on a Galera node (``@@wsrep_on``), else ``None``."""
    try:
        row = conn.exec_driver_sql("SELECT @@wsrep_on, @@wsrep_sync_wait").first()
    except sa.exc.DBAPIError as exc:
        if _errno(exc) != _UNKNOWN_VARIABLE:  # a lost connection is not "not Galera"
            raise
        conn.rollback()
        return None
    if row is None or str(row[0]) not in ("1", "ON"):
        return None
    return int(row[1])


def _errno(exc: sa.exc.DBAPIError) -> object:
    args = getattr(exc.orig, "args", ())
    return args[0] if args else None
