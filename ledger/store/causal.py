"""Causal reads on a Galera node: see every write the cluster committed before the read.

Galera certifies a write set on every node at commit but applies it on the others a
moment later, so a read on another node may not yet see it. Deciding writes never
needs to wait (a decision made on old state is fenced and made again), but the checks
every command makes on opening a store do: ``init`` through one node, then a command
through another, must find the schema, not tables without their version row (which
would read as an edited store) or no tables at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.errors import Unavailable
from ledger.log.db import Database

#: MySQL's "lock wait timeout exceeded", which a causal read that timed out reports.
_LOCK_WAIT_TIMEOUT = 1205
#: ``wsrep_sync_wait`` bits: 1 waits before SELECT (and BEGIN), 8 before SHOW.
_READ_AND_SHOW = 1 | 8


@contextmanager
def causal_connection(db: Database) -> Iterator[Connection]:
    """A connection whose reads see every write the cluster committed before them.

    On a Galera node (``@@wsrep_on``) the schema check waits until the node has applied
    the write sets certified before it (``wsrep_sync_wait`` READ and SHOW, for this check
    only: the schema inspector reads with SHOW):
    ``init`` through one node, then a command through another a moment later, must find
    the schema, not tables whose version row is still on its way (which would read as an
    edited store). Elsewhere (SQLite, MariaDB without Galera, MySQL) nothing changes.
    """
    with db.engine.connect() as conn:
        previous = None if db.is_sqlite else _wsrep_sync_wait(conn)
        if previous is None:
            yield conn
            return
        conn.rollback()  # a wait is skipped inside an open transaction: start a new one
        conn.exec_driver_sql(f"SET SESSION wsrep_sync_wait = {_READ_AND_SHOW}")
        try:
            _catch_up(conn, db)
            yield conn
        finally:
            conn.rollback()
            conn.exec_driver_sql(f"SET SESSION wsrep_sync_wait = {int(previous)}")


def _wsrep_sync_wait(conn: Connection) -> int | None:
    """This session's ``wsrep_sync_wait`` on a Galera node, else ``None``."""
    try:
        row = conn.exec_driver_sql("SELECT @@wsrep_on, @@wsrep_sync_wait").first()
    except sa.exc.DBAPIError:  # not MariaDB/Galera: no such variables
        conn.rollback()
        return None
    if row is None or str(row[0]) not in ("1", "ON"):
        return None
    return int(row[1])


def _catch_up(conn: Connection, db: Database) -> None:
    """Wait (one causal SELECT) until the node has applied what the cluster committed.

    A node that cannot catch up within Galera's ``repl.causal_read_timeout`` (a node held
    by a backup's lock, or far behind) is UNAVAILABLE, named as such: use another node.
    """
    try:
        conn.exec_driver_sql("SELECT 1").scalar()
    except sa.exc.DBAPIError as exc:
        code = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
        if code != _LOCK_WAIT_TIMEOUT:
            raise
        raise Unavailable(
            "this Galera node did not catch up with the cluster within its causal-read "
            "timeout (repl.causal_read_timeout): it is behind or paused; retry, or use "
            "another node",
            url=db.display_url,
            retryable=True,
        ) from None
