"""``_System_CommandLog``: every recorded command, maintained in catch-up mode.

An optional operator view (which command ids ran, of what kind, at which
position), so it follows the log from its own position instead of adding work
to every append.
"""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa

from domain.event_types import T_RECORDED
from ledger.log.sqltypes import BigInt, Binary, enc
from projections.framework import Projection, Replayer, TableReplayer, ViewEvent
from projections.rows import RowStore
from projections.tables import view_table

COMMAND_LOG = view_table(
    "_System_CommandLog",
    "view_command_log",
    ["command_id"],
    sa.Column("command_id", Binary(255)),
    sa.Column("kind", Binary(64), nullable=False),
    sa.Column("request_digest", Binary(64), nullable=False),
    sa.Column("position", BigInt(), nullable=False),
)


class CommandLogView(Projection):
    name = "command_log"
    version = 1
    tables = (COMMAND_LOG,)
    types: ClassVar[frozenset[str]] = frozenset({T_RECORDED})
    inline = False
    weight = 0.1

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        rows.put(
            COMMAND_LOG,
            {
                "command_id": enc(d["command_id"]),
                "kind": enc(d["kind"]),
                "request_digest": enc(d["request_digest"]),
                "position": event.position,
            },
        )

    def replayer(self, view_version: int) -> Replayer:
        return _CommandLogReplay(view_version)


if COMMAND_LOG.columns != ("command_id", "kind", "request_digest", "position"):
    raise AssertionError("_CommandLogReplay assumes the column order of COMMAND_LOG")


class _CommandLogReplay(TableReplayer):
    """``CommandLogView.apply`` as a rebuild kernel (same rows, as tuples)."""

    table = COMMAND_LOG

    def __init__(self, view_version: int) -> None:
        super().__init__(view_version)
        rows, vv = self.rows, view_version

        def recorded(position: int, d: dict[str, Any]) -> None:
            command_id = enc(d["command_id"])
            rows[(command_id,)] = (
                vv,
                command_id,
                enc(d["kind"]),
                enc(d["request_digest"]),
                position,
            )

        self.handlers = {T_RECORDED: recorded}
