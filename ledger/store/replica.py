"""Is this store ours to write, and is it a replica? Asked without writing anything.

A read service may be pointed at an asynchronous replica (R19: readers there
are STALE-aware) through an account that may only SELECT. Such a service must
never try to write: not even the catch-up of a view, which on a replica would
also make it diverge from its primary and break replication. ``writable``
answers from what the server says (``@@read_only``) and from the account's own
privileges as ``information_schema`` lists them; anything it cannot establish
counts as read-only. ``replication`` reads ``SHOW SLAVE STATUS`` for health
reports (it needs the ``SLAVE MONITOR`` privilege, and is ``None`` without it or
on a server that replicates from nobody).
"""

from __future__ import annotations

from typing import Any, TypedDict

from domain.errors import LedgerError
from ledger.log.db import Database

#: The account's UPDATE privilege on the projection state table, at any grant level
#: (global, this schema, that table), for the account the server authenticated.
_MAY_UPDATE = """
SELECT
  (SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES
    WHERE GRANTEE = u.grantee AND PRIVILEGE_TYPE = 'UPDATE')
+ (SELECT COUNT(*) FROM information_schema.SCHEMA_PRIVILEGES
    WHERE GRANTEE = u.grantee AND PRIVILEGE_TYPE = 'UPDATE' AND TABLE_SCHEMA = DATABASE())
+ (SELECT COUNT(*) FROM information_schema.TABLE_PRIVILEGES
    WHERE GRANTEE = u.grantee AND PRIVILEGE_TYPE = 'UPDATE' AND TABLE_SCHEMA = DATABASE()
      AND TABLE_NAME = 'projection_state')
FROM (SELECT CONCAT('''', LEFT(c.cu, LENGTH(c.cu) - LENGTH(SUBSTRING_INDEX(c.cu, '@', -1)) - 1),
                    '''@''', SUBSTRING_INDEX(c.cu, '@', -1), '''') AS grantee
      FROM (SELECT CURRENT_USER() AS cu) c) u
"""


class Replication(TypedDict):
    """What a replica says about its replication from the primary."""

    io_running: bool
    sql_running: bool
    seconds_behind_primary: int | None
    last_error: str | None


def writable(db: Database) -> bool:
    """Whether this process may write the store (catch up views): ``False`` on a server
    in ``read_only`` mode and for an account without UPDATE on the store's state."""
    if db.is_sqlite:
        return True
    try:
        rows = db.query("SELECT @@read_only")
        if not rows or int(rows[0][0]) != 0:
            return False
        found = db.query(_MAY_UPDATE)
    except (LedgerError, TypeError, ValueError):
        return False
    return bool(found) and int(found[0][0] or 0) > 0


def replication(db: Database) -> Replication | None:
    """The replica's replication state, or ``None`` (not a replica, or not allowed to see)."""
    if db.is_sqlite:
        return None
    try:
        with db.read() as conn:
            row: Any = conn.exec_driver_sql("SHOW SLAVE STATUS").mappings().first()
    except LedgerError:
        return None
    if row is None:
        return None
    behind = row.get("Seconds_Behind_Master")
    error = row.get("Last_SQL_Error") or row.get("Last_IO_Error") or None
    return {
        "io_running": row.get("Slave_IO_Running") == "Yes",
        "sql_running": row.get("Slave_SQL_Running") == "Yes",
        "seconds_behind_primary": None if behind is None else int(behind),
        "last_error": str(error) if error else None,
    }
