"""``projection_state``: each view's code version, live version, position and chain."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.errors import IntegrityFailure
from ledger.log.sqltypes import BigInt, Binary, Blob

state_table = sa.Table(
    "projection_state",
    sa.MetaData(),  # the registry assembles the store's (``view_metadata``)
    sa.Column("name", Binary(64), primary_key=True),
    sa.Column("code_version", sa.Integer(), nullable=False),
    sa.Column("live_version", sa.Integer(), nullable=False),
    sa.Column("position", BigInt(), nullable=False),
    sa.Column("chain", Binary(32), nullable=False),
    sa.Column("mode", Binary(16), nullable=False),
    sa.Column("stopped", sa.Boolean(), nullable=False),
    sa.Column("error", Blob(), nullable=True),
    sa.Column("building_version", sa.Integer(), nullable=True),
)


@dataclass
class ProjectionState:
    name: str
    code_version: int
    live_version: int
    position: int
    chain: bytes
    mode: str
    stopped: bool
    error: dict[str, Any] | None
    building_version: int | None = None

    @classmethod
    def from_row(cls, row: Any) -> ProjectionState:
        """A ``projection_state`` row; a cell that is not what the schema declares is an
        edited row: INTEGRITY naming the table (never an internal error)."""
        try:
            return cls._from_row(row)
        except (TypeError, ValueError, AttributeError) as exc:  # orjson's: a ValueError
            name = row.name if isinstance(row.name, bytes) else None
            raise IntegrityFailure(
                f"a projection_state row is not what the schema declares "
                f"({type(exc).__name__}: {exc}); the views can be made afresh from the "
                "log: `catalog-ledger export --jsonl --out log.jsonl`, then `init` and "
                "`import --jsonl log.jsonl` into a new store",
                table="projection_state",
                view=name.decode(errors="replace") if name is not None else None,
            ) from None

    @classmethod
    def _from_row(cls, row: Any) -> ProjectionState:
        return cls(
            name=bytes(row.name).decode(),
            code_version=int(row.code_version),
            live_version=int(row.live_version),
            position=int(row.position),
            chain=bytes(row.chain),
            mode=bytes(row.mode).decode(),
            stopped=bool(row.stopped),
            error=orjson.loads(row.error) if row.error is not None else None,
            building_version=int(row.building_version)
            if row.building_version is not None
            else None,
        )

    def values(self) -> dict[str, Any]:
        return {
            "name": self.name.encode(),
            "code_version": self.code_version,
            "live_version": self.live_version,
            "position": self.position,
            "chain": self.chain,
            "mode": self.mode.encode(),
            "stopped": self.stopped,
            "error": orjson.dumps(self.error) if self.error is not None else None,
            "building_version": self.building_version,
        }


def load_states(conn: Connection, *, lock: bool = False) -> dict[str, ProjectionState]:
    query = sa.select(state_table)
    if lock and conn.dialect.name in ("mysql", "mariadb"):
        query = query.with_for_update()
    return {s.name: s for s in (ProjectionState.from_row(r) for r in conn.execute(query))}


def save_state(conn: Connection, state: ProjectionState) -> None:
    values = state.values()
    updated = conn.execute(
        state_table.update().where(state_table.c.name == values["name"]).values(values)
    )
    if updated.rowcount == 0:
        conn.execute(state_table.insert().values(values))
