"""``_System_PackGeneration``: every attempt with its status and frozen facts; its table,
``apply`` and rebuild kernel.
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

import sqlalchemy as sa

from domain.event_types import (
    T_ACTIVATED,
    T_FAILED,
    T_PREPARED,
    T_RETIRED,
)
from ledger.log.sqltypes import Binary, Blob
from projections.framework import Projection, Replayer, TableReplayer, ViewEvent
from projections.rows import RowStore
from projections.tables import Key, view_table
from projections.views.cells import (
    ACTIVE,
    FAILED_CLEAN,
    FAILED_DIRTY,
    PREPARING,
    RETIRED,
    columns_are,
    opt,
)

PACK_GENERATION = view_table(
    "_System_PackGeneration",
    "view_pack_generation",
    ["pack", "install_id"],
    sa.Column("pack", Binary(255)),
    sa.Column("install_id", Binary(255)),
    sa.Column("ordinal", sa.BigInteger(), nullable=False),
    sa.Column("origin", Binary(16), nullable=False),
    sa.Column("status", Binary(16), nullable=False),
    sa.Column("category", Binary(255), nullable=False),
    sa.Column("source_kind", Binary(32), nullable=False),
    sa.Column("locator", Blob(), nullable=False),
    sa.Column("revision", Binary(255), nullable=True),
    sa.Column("path", Blob(), nullable=False),
    sa.Column("payload_hash", Binary(80), nullable=False),
    sa.Column("applied_payload_hash", Binary(80), nullable=True),
    sa.Column("epoch", sa.BigInteger(), nullable=True),
    sa.Column("from_install_id", Binary(255), nullable=True),
    sa.Column("failure_reason", Blob(), nullable=True),
    indexes=[["status"]],
)


class PackGenerationView(Projection):
    """``_System_PackGeneration``: every attempt, its status and frozen facts."""

    name = "pack_generation"
    version = 1
    weight = 4.5
    tables = (PACK_GENERATION,)
    types: ClassVar[frozenset[str]] = frozenset({T_PREPARED, T_ACTIVATED, T_RETIRED, T_FAILED})

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        key = (d["pack"].encode(), d["install_id"].encode())
        if event.type == T_PREPARED:
            source = d["source"]
            rows.put(
                PACK_GENERATION,
                {
                    "pack": key[0],
                    "install_id": key[1],
                    "ordinal": d["ordinal"],
                    "origin": d["origin"].encode(),
                    "status": PREPARING,
                    "category": d["category"].encode(),
                    "source_kind": source["kind"].encode(),
                    "locator": source["locator"].encode(),
                    "revision": opt(source.get("revision")),
                    "path": source["path"].encode(),
                    "payload_hash": d["payload_hash"].encode(),
                    "applied_payload_hash": None,
                    "epoch": None,
                    "from_install_id": opt(d.get("from_install_id")),
                    "failure_reason": None,
                },
            )
            return
        row = rows.get(PACK_GENERATION, key)
        if row is None:
            raise LookupError(f"generation {d['install_id']} of {d['pack']!r} was never prepared")
        row = dict(row)  # never mutate a row another store layer may still hold
        if event.type == T_ACTIVATED:
            row["status"] = ACTIVE
            row["applied_payload_hash"] = d["applied_payload_hash"].encode()
            row["epoch"] = d["epoch"]
        elif event.type == T_RETIRED:
            row["status"] = RETIRED
        else:
            row["status"] = FAILED_DIRTY if d["dirty"] else FAILED_CLEAN
            row["failure_reason"] = d["reason"].encode()
        rows.put(PACK_GENERATION, row)

    def replayer(self, view_version: int) -> Replayer:
        return _PackGenerationReplay(view_version)


columns_are(
    PACK_GENERATION,
    "pack",
    "install_id",
    "ordinal",
    "origin",
    "status",
    "category",
    "source_kind",
    "locator",
    "revision",
    "path",
    "payload_hash",
    "applied_payload_hash",
    "epoch",
    "from_install_id",
    "failure_reason",
)


class _PackGenerationReplay(TableReplayer):
    """``PackGenerationView.apply`` as a rebuild kernel; rows are lists updated in place
    (index 0 is ``view_version``, then the columns above)."""

    table = PACK_GENERATION

    def __init__(self, view_version: int) -> None:
        super().__init__(view_version)
        rows, vv = cast(dict[Key, list[Any]], self.rows), view_version  # updated in place

        def prepared(_position: int, d: dict[str, Any]) -> None:
            pack, install_id = d["pack"].encode(), d["install_id"].encode()
            source = d["source"]
            revision = source.get("revision")
            previous = d.get("from_install_id")
            rows[(pack, install_id)] = [
                vv,
                pack,
                install_id,
                d["ordinal"],
                d["origin"].encode(),
                PREPARING,
                d["category"].encode(),
                source["kind"].encode(),
                source["locator"].encode(),
                None if revision is None else revision.encode(),
                source["path"].encode(),
                d["payload_hash"].encode(),
                None,
                None,
                None if previous is None else previous.encode(),
                None,
            ]

        def activated(_position: int, d: dict[str, Any]) -> None:
            row = rows[(d["pack"].encode(), d["install_id"].encode())]
            row[5] = ACTIVE
            row[12] = d["applied_payload_hash"].encode()
            row[13] = d["epoch"]

        def retired(_position: int, d: dict[str, Any]) -> None:
            rows[(d["pack"].encode(), d["install_id"].encode())][5] = RETIRED

        def failed(_position: int, d: dict[str, Any]) -> None:
            row = rows[(d["pack"].encode(), d["install_id"].encode())]
            row[5] = FAILED_DIRTY if d["dirty"] else FAILED_CLEAN
            row[15] = d["reason"].encode()

        self.handlers = {
            T_PREPARED: prepared,
            T_ACTIVATED: activated,
            T_RETIRED: retired,
            T_FAILED: failed,
        }
