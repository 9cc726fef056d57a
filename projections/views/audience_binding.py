"""``_System_AudienceBinding``: every binding in force now (published or not), the
publisher's input; its table, ``apply`` and rebuild kernel."""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa

from domain.event_types import T_GRANTED, T_REBOUND, T_REVOKED
from ledger.log.sqltypes import BigInt, Binary, enc
from projections.framework import Projection, Replayer, TableReplayer, ViewEvent
from projections.rows import RowStore
from projections.tables import view_table


def binding_key(d: dict[str, Any]) -> tuple[bytes, ...]:
    """(audience kind, audience id, pack, kind, key, credential set or b"")."""
    cred = d.get("credential_set")
    return (
        enc(d["audience_kind"]),
        enc(d["audience_id"]),
        enc(d["pack"]),
        enc(d["kind"]),
        enc(d["key"]),
        enc(cred) if cred is not None else b"",
    )


_BINDING_COLUMNS = (
    sa.Column("audience_kind", Binary(16)),
    sa.Column("audience_id", Binary(255)),
    sa.Column("pack", Binary(255)),
    sa.Column("kind", Binary(255)),
    sa.Column("key", Binary(255)),
    sa.Column("credential_set", Binary(255)),
)
BINDING_KEY = ["audience_kind", "audience_id", "pack", "kind", "key", "credential_set"]


def binding_columns(*extra: sa.Column[Any]) -> list[sa.Column[Any]]:
    return [c._copy() for c in _BINDING_COLUMNS] + list(extra)


AUDIENCE_BINDING = view_table(
    "_System_AudienceBinding",
    "view_audience_binding",
    BINDING_KEY,
    *binding_columns(
        sa.Column("install_id", Binary(255), nullable=False),
        sa.Column("payload_hash", Binary(80), nullable=False),
        sa.Column("position", BigInt(), nullable=False),
    ),
    # Publication's access path by pack: the audiences binding a pack whose authority
    # moved, and what a pack has bound (the incremental build re-encodes that pack).
    indexes=[["pack"]],
)


class AudienceBindingView(Projection):
    """Bindings in force now, by audience (R14)."""

    name = "audience_binding"
    version = 1
    weight = 1.0
    tables = (AUDIENCE_BINDING,)
    types: ClassVar[frozenset[str]] = frozenset({T_GRANTED, T_REBOUND, T_REVOKED})

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        key = binding_key(d)
        if event.type == T_REVOKED:
            rows.delete(AUDIENCE_BINDING, key)
            return
        rows.put(
            AUDIENCE_BINDING,
            dict(
                zip(BINDING_KEY, key, strict=True),
                install_id=enc(d["install_id"]),
                payload_hash=enc(d["payload_hash"]),
                position=event.position,
            ),
        )

    def replayer(self, view_version: int) -> Replayer:
        return _AudienceBindingReplay(view_version)


if AUDIENCE_BINDING.columns != (*BINDING_KEY, "install_id", "payload_hash", "position"):
    raise AssertionError("_AudienceBindingReplay assumes the column order of AUDIENCE_BINDING")


class _AudienceBindingReplay(TableReplayer):
    """``AudienceBindingView.apply`` as a rebuild kernel (same rows, as tuples)."""

    table = AUDIENCE_BINDING

    def __init__(self, view_version: int) -> None:
        super().__init__(view_version)
        rows, vv = self.rows, view_version

        def bound(position: int, d: dict[str, Any]) -> None:
            key = binding_key(d)
            rows[key] = (
                vv,
                *key,
                d["install_id"].encode(),
                d["payload_hash"].encode(),
                position,
            )

        def revoked(_position: int, d: dict[str, Any]) -> None:
            rows.pop(binding_key(d), None)

        self.handlers = {T_GRANTED: bound, T_REBOUND: bound, T_REVOKED: revoked}
