"""The writer lease's coordination row (``ledger_lease``): expiry by compare-and-set.

The log records who acquired, released or broke the lease and at which epoch;
this row only carries the *current* expiry, so that renewing a lease every few
seconds costs one ``UPDATE`` and adds nothing to the immutable log. Every
update is conditional on (holder, epoch): a holder whose epoch has moved on
cannot renew, and an acquisition re-checks the row under its lock inside the
append transaction, so a renewal and a takeover never both succeed.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ledger.log import tables
from ledger.log.sqltypes import dec, enc

_t = tables.lease


@dataclass(frozen=True)
class LeaseRow:
    holder: str
    epoch: int
    expires_at_us: int


def read(conn: Connection, name: str, *, for_update: bool = False) -> LeaseRow | None:
    query = sa.select(_t.c.holder, _t.c.epoch, _t.c.expires_at_us).where(_t.c.name == enc(name))
    if for_update and conn.dialect.name != "sqlite":  # SQLite's write lock covers it
        query = query.with_for_update()
    row = conn.execute(query).first()
    if row is None:
        return None
    return LeaseRow(dec(row.holder), int(row.epoch), int(row.expires_at_us))


def claim(conn: Connection, name: str, holder: str, epoch: int, expires_at_us: int) -> None:
    """Set the row to (holder, epoch, expiry): an acquisition, release or break."""
    values = {"holder": enc(holder), "epoch": epoch, "expires_at_us": expires_at_us}
    updated = conn.execute(_t.update().where(_t.c.name == enc(name)).values(**values))
    if updated.rowcount == 0:
        conn.execute(_t.insert().values(name=enc(name), **values))


def renew(conn: Connection, name: str, holder: str, epoch: int, expires_at_us: int) -> bool:
    """Move the expiry of ``holder``'s lease at ``epoch``; ``False`` when it is not theirs."""
    updated = conn.execute(
        _t.update()
        .where(_t.c.name == enc(name), _t.c.holder == enc(holder), _t.c.epoch == epoch)
        .values(expires_at_us=expires_at_us)
    )
    return bool(updated.rowcount)
