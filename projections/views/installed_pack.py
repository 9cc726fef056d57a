"""``_System_InstalledPack``, the compatibility view: its table, ``apply`` and rebuild kernel.

One row per pack, describing only the *selected* generation (never the newest attempt),
or the in-place record of a ``local_path`` pack, or a not-yet-adopted legacy row. A
removed pack has no row (R7); the log keeps its history.
"""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa

from domain.event_types import (
    T_ADVANCED,
    T_LEGACY,
    T_LOCAL_INSTALLED,
    T_LOCAL_REINSTALLED,
    T_LOCAL_REMOVED,
    T_LOCAL_UPDATED,
    T_REINSTALLED,
    T_REMOVED,
    T_STARTED,
)
from domain.lifecycle import SourceKind
from ledger.log.sqltypes import Binary, Blob, enc
from projections.framework import Projection, Replayer, TableReplayer, ViewEvent
from projections.rows import RowStore
from projections.tables import view_table
from projections.views.cells import (
    ACTIVE,
    columns_are,
    opt,
)

INSTALLED_PACK = view_table(
    "_System_InstalledPack",
    "view_installed_pack",
    ["pack"],
    sa.Column("pack", Binary(255)),
    sa.Column("install_id", Binary(255), nullable=False),
    sa.Column("category", Binary(255), nullable=False),
    sa.Column("source_kind", Binary(32), nullable=False),
    sa.Column("locator", Blob(), nullable=False),
    sa.Column("revision", Binary(255), nullable=True),
    sa.Column("applied_payload_hash", Blob(), nullable=True),
    sa.Column("status", Binary(255), nullable=False),
    sa.Column("epoch", sa.BigInteger(), nullable=True),
)


class InstalledPackView(Projection):
    """``_System_InstalledPack`` follows the activation pointer, never attempts (R8);
    a removal deletes the row (R7)."""

    name = "installed_pack"
    # Removal and re-installation (issue 15) added types but change no row of any log
    # without them, so views built before stay exact: the version is unchanged.
    version = 1
    tables = (INSTALLED_PACK,)
    types: ClassVar[frozenset[str]] = frozenset(
        {
            T_STARTED,
            T_ADVANCED,
            T_REMOVED,
            T_REINSTALLED,
            T_LOCAL_INSTALLED,
            T_LOCAL_UPDATED,
            T_LOCAL_REMOVED,
            T_LOCAL_REINSTALLED,
            T_LEGACY,
        }
    )

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        topic = event.type
        if topic in (T_REMOVED, T_LOCAL_REMOVED):
            key = (enc(d["pack"]),)
            if rows.get(INSTALLED_PACK, key) is None:
                raise LookupError(f"pack {d['pack']!r} removed while it had no row")
            rows.delete(INSTALLED_PACK, key)
            return
        if topic in (T_STARTED, T_ADVANCED, T_REINSTALLED):
            source = d["source"]
            row = {
                "pack": enc(d["pack"]),
                "install_id": enc(d["install_id"]),
                "category": enc(d["category"]),
                "source_kind": enc(source["kind"]),
                "locator": enc(source["locator"]),
                "revision": enc(d["revision"]),
                "applied_payload_hash": enc(d["payload_hash"]),
                "status": ACTIVE,
                "epoch": d["epoch"],
            }
        elif topic in (T_LOCAL_INSTALLED, T_LOCAL_REINSTALLED):
            row = self._local(d, enc(d["install_id"]))
        elif topic == T_LOCAL_UPDATED:
            current = rows.get(INSTALLED_PACK, (enc(d["pack"]),))
            if current is None:
                raise LookupError(f"local pack {d['pack']!r} updated before it was installed")
            row = self._local(d, current["install_id"])
        else:  # legacy record
            source = d["source"]
            row = {
                "pack": enc(d["pack"]),
                "install_id": enc(d["install_id"]),
                "category": enc(d["category"]),
                "source_kind": enc(str(source.get("kind", ""))),
                "locator": enc(str(source.get("repo") or source.get("path") or "")),
                "revision": opt(source.get("revision")),
                "applied_payload_hash": opt(d["applied_payload_hash"]),
                "status": enc(d["status"]),
                "epoch": None,
            }
        rows.put(INSTALLED_PACK, row)

    def replayer(self, view_version: int) -> Replayer:
        return _InstalledPackReplay(view_version)

    @staticmethod
    def _local(d: dict[str, Any], install_id: bytes) -> dict[str, Any]:
        return {
            "pack": enc(d["pack"]),
            "install_id": install_id,
            "category": enc(d["category"]),
            "source_kind": enc(SourceKind.LOCAL_PATH.value),
            "locator": enc(d["locator"]),
            "revision": None,
            "applied_payload_hash": enc(d["payload_hash"]),
            "status": ACTIVE,
            "epoch": None,
        }


columns_are(
    INSTALLED_PACK,
    "pack",
    "install_id",
    "category",
    "source_kind",
    "locator",
    "revision",
    "applied_payload_hash",
    "status",
    "epoch",
)
_LOCAL_PATH = SourceKind.LOCAL_PATH.value.encode()


class _InstalledPackReplay(TableReplayer):
    """``InstalledPackView.apply`` as a rebuild kernel (same rows, as tuples)."""

    table = INSTALLED_PACK

    def __init__(self, view_version: int) -> None:
        super().__init__(view_version)
        rows, vv = self.rows, view_version

        def removed(_position: int, d: dict[str, Any]) -> None:
            del rows[(d["pack"].encode(),)]  # KeyError: apply names the poison event

        def activated(_position: int, d: dict[str, Any]) -> None:
            source = d["source"]
            pack = d["pack"].encode()
            rows[(pack,)] = (
                vv,
                pack,
                d["install_id"].encode(),
                d["category"].encode(),
                source["kind"].encode(),
                source["locator"].encode(),
                d["revision"].encode(),
                d["payload_hash"].encode(),
                ACTIVE,
                d["epoch"],
            )

        def local(d: dict[str, Any], install_id: bytes) -> None:
            pack = d["pack"].encode()
            rows[(pack,)] = (
                vv,
                pack,
                install_id,
                d["category"].encode(),
                _LOCAL_PATH,
                d["locator"].encode(),
                None,
                d["payload_hash"].encode(),
                ACTIVE,
                None,
            )

        def local_installed(_position: int, d: dict[str, Any]) -> None:
            local(d, d["install_id"].encode())

        def local_updated(_position: int, d: dict[str, Any]) -> None:
            local(d, rows[(d["pack"].encode(),)][2])

        def legacy(_position: int, d: dict[str, Any]) -> None:
            source = d["source"]
            pack = d["pack"].encode()
            rows[(pack,)] = (
                vv,
                pack,
                d["install_id"].encode(),
                d["category"].encode(),
                str(source.get("kind", "")).encode(),
                str(source.get("repo") or source.get("path") or "").encode(),
                opt(source.get("revision")),
                opt(d["applied_payload_hash"]),
                d["status"].encode(),
                None,
            )

        self.handlers = {
            T_REMOVED: removed,
            T_LOCAL_REMOVED: removed,
            T_STARTED: activated,
            T_ADVANCED: activated,
            T_REINSTALLED: activated,
            T_LOCAL_INSTALLED: local_installed,
            T_LOCAL_REINSTALLED: local_installed,
            T_LOCAL_UPDATED: local_updated,
            T_LEGACY: legacy,
        }
