"""The cosigned checkpoints an export carries and an import restores (R29, issue 28 item 7).

``ledger_checkpoint`` (schema step 3) holds the collector's latest cosigned note per
origin. ``export`` writes each row as a checkpoint line (``ledger.log.checkpoint_line``)
read in the same transaction as the events; ``import`` checks each against the log it
loaded — the origin is the log's (``log.named``, else the target's store origin) or its
catalog log's, and the (size, root) is that tree at that size — and writes it back, so a
restored store serves the same cosigned notes and its witnesses resume where they were.

The table is addressed by name (``sa.table``) and its presence asked of the database, so
this module does not depend on how the schema declares it.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain import merkle
from domain.errors import IntegrityFailure, InvalidInput
from ledger.log.checkpoint_line import CheckpointLine

NAME = "ledger_checkpoint"
TABLE = sa.table(
    NAME,
    sa.column("origin"),
    sa.column("size"),
    sa.column("root"),
    sa.column("note"),
    sa.column("stored_at_us"),
)
#: The catalog log's origin is the main log's followed by this (LOG-FORMAT "Catalog log").
CATALOG_SUFFIX = "/catalog"


def has_table(conn: Connection) -> bool:
    return bool(sa.inspect(conn).has_table(NAME))


def read_all(conn: Connection) -> list[CheckpointLine]:
    """Every stored cosigned checkpoint, by origin (none when the store has no table)."""
    if not has_table(conn):
        return []
    rows = conn.execute(
        sa.select(TABLE.c.origin, TABLE.c.size, TABLE.c.root, TABLE.c.note, TABLE.c.stored_at_us)
    ).all()
    found = [
        CheckpointLine(
            origin=_text(origin),
            size=int(size),
            root=bytes(root),
            note=_text(note),
            stored_at_us=int(stored),
        )
        for origin, size, root, note, stored in rows
    ]
    return sorted(found, key=lambda c: c.origin.encode())


def _text(value: object) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8")
    return str(value)


def check_and_write(
    conn: Connection,
    carried: list[tuple[CheckpointLine, int]],
    *,
    origin: str,
    size: int,
    main_root_at: Callable[[int], bytes],
    catalog_ids: list[bytes],
) -> None:
    """Check every carried checkpoint (with its line number) against the imported log and
    write them (replacing whatever the empty target held): INTEGRITY naming the line and
    the field for a checkpoint of another log, of a tree this log is not, or a repeated
    origin; nothing is then committed."""
    seen: set[str] = set()
    for line, number in carried:
        if line.origin in seen:
            raise _refused(number, "origin", f"a second checkpoint line for {line.origin}")
        seen.add(line.origin)
        if line.origin == origin:
            leaves, what = size, "the log"
        elif line.origin == origin + CATALOG_SUFFIX:
            leaves, what = len(catalog_ids), "the catalog log"
        else:
            raise _refused(
                number,
                "origin",
                f"the checkpoint is of {line.origin!r}, not of this log ({origin!r}) or its "
                "catalog log",
            )
        if line.size > leaves:
            raise _refused(
                number, "size", f"the checkpoint's size {line.size} is past {what} ({leaves})"
            )
        if line.origin == origin:
            root = main_root_at(line.size)
        else:
            root = merkle.root([merkle.leaf_hash(e) for e in catalog_ids[: line.size]])
        if root != line.root:
            raise _refused(
                number, "root", f"{what} at size {line.size} has another root: not this log"
            )
    if not carried:
        return
    if not has_table(conn):
        raise InvalidInput(
            f"the export carries cosigned checkpoints and this store has no {NAME} table "
            "(schema version 3); run `catalog-ledger migrate`",
            field="db",
        )
    conn.execute(sa.delete(TABLE))
    conn.execute(
        TABLE.insert(),
        [
            {
                "origin": c.origin.encode(),
                "size": c.size,
                "root": c.root,
                "note": c.note.encode(),
                "stored_at_us": c.stored_at_us,
            }
            for c, _ in carried
        ],
    )


def _refused(line: int, key: str, problem: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"line {line}: {problem}; nothing was imported",
        line=line,
        field=f"checkpoint.{key}",
        check="checkpoint",
    )


def catalog_event_ids(conn: Connection) -> list[bytes]:
    """The catalog log's leaf data: the event ids of the ``catalog.published`` events, in
    revision order (LOG-FORMAT "Catalog log")."""
    from domain.catalog import catalog_id
    from domain.event_types import EVENT_TYPES, T_PUBLISHED
    from ledger.log import tables as schema

    t = schema.events
    topics = [x.encode() for x in EVENT_TYPES.topics_of([T_PUBLISHED])]
    rows = conn.execute(
        sa.select(t.c.event_id)
        .where(t.c.aggregate_id == catalog_id().bytes, t.c.topic.in_(topics))
        .order_by(t.c.position)
    )
    return [bytes(r[0]) for r in rows]
