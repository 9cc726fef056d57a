"""The head row against the log (R24): ``ledger_head`` must name the last stored row.

Every append locks ``ledger_head`` and writes past it, so a head that is missing or
that disagrees with the last row of ``ledger_events`` (its position and chain) makes
every later write collide (CONFLICT) or, worse, lets ``init`` start a second log at
position 0 over the existing one. Such a store is refused by every command
(INTEGRITY naming ``ledger_head``); ``doctor --repair`` rebuilds the row from the log,
and only after checking every event id and chain link up to the last row.

A deleted tail whose head was rewritten to the new last row passes this check (and
every other local one): only a checkpoint an auditor kept catches it (R22).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Connection

from domain.digests import ZERO_CHAIN, event_id, next_chain
from domain.errors import IntegrityFailure
from ledger.log import tables as schema
from ledger.log.recorder import LedgerRecorder

#: How ``doctor`` marks a head row ``doctor --repair`` rebuilds from the log.
REPAIR_HINT = "(run `catalog-ledger doctor --repair`)"

_ROW = (
    f"SELECT h.position, h.chain, e.position, e.chain FROM (SELECT 1 AS one) AS x "
    f"LEFT JOIN {schema.head.name} AS h ON h.id = 1 "
    f"LEFT JOIN {schema.events.name} AS e "
    f"ON e.position = (SELECT MAX(position) FROM {schema.events.name})"
)


@dataclass(frozen=True)
class HeadCheck:
    """The head row and the last stored row, read in one statement (one snapshot)."""

    head: tuple[int, bytes] | None
    last: tuple[int, bytes]

    @property
    def ok(self) -> bool:
        return self.head == self.last

    def expected(self) -> str:
        position, chain = self.last
        return f"position {position}, chain {chain.hex()} (the last row of ledger_events)"

    def found(self) -> str:
        if self.head is None and self.last[0] == 0:
            return "no head row over an empty log (an interrupted init: run `catalog-ledger init`)"
        if self.head is None:
            return f"no head row {REPAIR_HINT}"
        position, chain = self.head
        return f"position {position}, chain {chain.hex()} {REPAIR_HINT}"


def _binary(value: object) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise IntegrityFailure(
        f"a stored chain is {type(value).__name__}, where the schema declares binary",
        table="ledger_head",
    )


#: SQLite keeps any type in any column: read the chains as bytes, with their stored types.
_ROW_SQLITE = (
    f"SELECT h.position, CAST(h.chain AS BLOB), e.position, CAST(e.chain AS BLOB), "
    f"typeof(h.chain), typeof(e.chain), typeof(h.position) FROM (SELECT 1 AS one) AS x "
    f"LEFT JOIN {schema.head.name} AS h ON h.id = 1 "
    f"LEFT JOIN {schema.events.name} AS e "
    f"ON e.position = (SELECT MAX(position) FROM {schema.events.name})"
)


def read(conn: Connection) -> HeadCheck:
    """The head row and the last row of ``ledger_events`` (both tables exist)."""
    if conn.dialect.name == "sqlite":
        row = conn.exec_driver_sql(_ROW_SQLITE).one()
        head_type, last_type, position_type = row[4:7]
        if row[0] is not None and (head_type != "blob" or position_type != "integer"):
            raise IntegrityFailure(
                f"the head row is stored as {head_type}/{position_type}, where the schema "
                f"declares a binary chain and an integer position {REPAIR_HINT}",
                table="ledger_head",
            )
        if row[2] is not None and last_type != "blob":
            raise IntegrityFailure(
                f"the last row's chain is stored as {last_type}, where the schema declares "
                "binary (`catalog-ledger audit verify` names the position)",
                table="ledger_events",
                position=int(row[2]),
            )
    else:
        row = conn.exec_driver_sql(_ROW).one()
    head = None if row[0] is None else (int(row[0]), _binary(row[1]))
    last = (0, ZERO_CHAIN) if row[2] is None else (int(row[2]), _binary(row[3]))
    return HeadCheck(head, last)


def has_events(conn: Connection) -> bool:
    found = conn.exec_driver_sql(f"SELECT 1 FROM {schema.events.name} LIMIT 1").first()
    return found is not None


def refuse(check: HeadCheck | None) -> IntegrityFailure:
    """``init`` on a store whose head does not name its last row (``None``: the
    ``ledger_head`` table itself is missing over a log of events)."""
    found = "the table is missing" if check is None else check.found()
    expected = "" if check is None else f" (expected {check.expected()})"
    return IntegrityFailure(
        f"ledger_head does not name the last row of the log: {found}{expected}; no head "
        "is created over existing events: `catalog-ledger doctor --repair` rebuilds it "
        "from the log after checking the chain",
        rule="R24",
        table="ledger_head",
    )


def rebuild(conn: Connection, recorder: LedgerRecorder) -> tuple[int, bytes]:
    """Check every row's event id and chain link from position 1 to the last row, then
    write the head row at the last row, inside the caller's write transaction.

    A break in the chain is INTEGRITY naming the first bad position, and nothing is
    written: a head is never rebuilt over a log that does not verify.
    """
    hd = schema.head
    conn.execute(hd.select().where(hd.c.id == 1).with_for_update()).first()  # appends wait
    chain, expected = ZERO_CHAIN, 0
    for position, aggregate, version, topic, state, stored_id, stored_chain in recorder.scan_full(
        conn
    ):
        expected += 1
        if position != expected:
            raise _broken(expected, "position", f"found position {position} (a row is missing)")
        if event_id(aggregate, version, topic, state) != stored_id:
            raise _broken(position, "event_id", "the event id does not match the stored bytes")
        chain = next_chain(chain, stored_id)
        if chain != stored_chain:
            raise _broken(position, "chain", "the chain does not follow from the previous row")
    exists = conn.execute(hd.select().where(hd.c.id == 1)).first() is not None
    if exists:
        conn.execute(hd.update().where(hd.c.id == 1).values(position=expected, chain=chain))
    else:
        conn.execute(hd.insert(), {"id": 1, "position": expected, "chain": chain})
    return expected, chain


def _broken(position: int, check: str, what: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"ledger_head is not rebuilt: the log does not verify at position {position} "
        f"({check}: {what}); nothing was written",
        rule="R24",
        table="ledger_head",
        position=position,
        check=check,
    )
