"""The cosigned checkpoints an export carries and an import restores (R29, issue 28 item 7).

``ledger_checkpoint`` (schema step 3) holds the collector's latest cosigned note per
origin. ``export`` writes each row as a checkpoint line (``ledger.log.checkpoint_line``)
read in the same transaction as the events; ``import`` checks each against the log it
loaded — the origin is the log's (``log.named``, else the target's store origin) or its
catalog log's, and the (size, root) is that tree at that size — and writes it back, so a
restored store serves the same cosigned notes and its witnesses resume where they were.

The table's presence is asked of the database: the read-only commands (``export``) also
read stores of a schema older than the table.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain import merkle
from domain.errors import IntegrityFailure, InvalidInput
from domain.origin import catalog_origin
from ledger.log import tables as schema
from ledger.log.checkpoint_line import CheckpointLine
from ledger.log.sqltypes import enc
from ledger.store.catalog_log import stored_checkpoints

TABLE = schema.checkpoint
NAME = TABLE.name


def has_table(conn: Connection) -> bool:
    return bool(sa.inspect(conn).has_table(NAME))


def read_all(conn: Connection) -> list[CheckpointLine]:
    """Every stored cosigned checkpoint, by origin (none for a store of a schema older
    than the table, which the read-only audit commands still read)."""
    if not has_table(conn):
        return []
    return [
        CheckpointLine(c.origin, c.size, c.root, c.note, c.stored_at_us)
        for c in stored_checkpoints(conn)
    ]


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
        elif line.origin == catalog_origin(origin):
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
                "origin": enc(c.origin),
                "size": c.size,
                "root": c.root,
                "note": enc(c.note),
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
