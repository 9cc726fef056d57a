"""``_System_PackActivation``: pack, selected install id, epoch (no row while the pack is
removed: the pointer selects nothing); its table, ``apply`` and rebuild kernel.
"""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa

from domain.event_types import (
    T_ADVANCED,
    T_REINSTALLED,
    T_REMOVED,
    T_STARTED,
)
from ledger.log.sqltypes import BigInt, Binary, enc
from projections.framework import Projection, Replayer, TableReplayer, ViewEvent
from projections.rows import RowStore
from projections.tables import view_table
from projections.views.cells import (
    columns_are,
)

PACK_ACTIVATION = view_table(
    "_System_PackActivation",
    "view_pack_activation",
    ["pack"],
    sa.Column("pack", Binary(255)),
    sa.Column("install_id", Binary(255), nullable=False),
    sa.Column("epoch", sa.BigInteger(), nullable=False),
    sa.Column("revision", Binary(255), nullable=False),
    sa.Column("payload_hash", Binary(80), nullable=False),
    sa.Column("position", BigInt(), nullable=False),
)


class PackActivationView(Projection):
    """``_System_PackActivation``: the pointer, with the log position it moved at; no row
    while the pack is removed (R7)."""

    name = "pack_activation"
    version = 1  # removal added types, no row of an older log changes (see above)
    tables = (PACK_ACTIVATION,)
    types: ClassVar[frozenset[str]] = frozenset({T_STARTED, T_ADVANCED, T_REMOVED, T_REINSTALLED})

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        if event.type == T_REMOVED:
            rows.delete(PACK_ACTIVATION, (enc(d["pack"]),))
            return
        rows.put(
            PACK_ACTIVATION,
            {
                "pack": enc(d["pack"]),
                "install_id": enc(d["install_id"]),
                "epoch": d["epoch"],
                "revision": enc(d["revision"]),
                "payload_hash": enc(d["payload_hash"]),
                "position": event.position,
            },
        )

    def replayer(self, view_version: int) -> Replayer:
        return _PackActivationReplay(view_version)


columns_are(PACK_ACTIVATION, "pack", "install_id", "epoch", "revision", "payload_hash", "position")


class _PackActivationReplay(TableReplayer):
    """``PackActivationView.apply`` as a rebuild kernel."""

    table = PACK_ACTIVATION

    def __init__(self, view_version: int) -> None:
        super().__init__(view_version)
        rows, vv = self.rows, view_version

        def removed(_position: int, d: dict[str, Any]) -> None:
            rows.pop((d["pack"].encode(),), None)

        def moved(position: int, d: dict[str, Any]) -> None:
            pack = d["pack"].encode()
            rows[(pack,)] = (
                vv,
                pack,
                d["install_id"].encode(),
                d["epoch"],
                d["revision"].encode(),
                d["payload_hash"].encode(),
                position,
            )

        self.handlers = {
            T_REMOVED: removed,
            T_STARTED: moved,
            T_ADVANCED: moved,
            T_REINSTALLED: moved,
        }
