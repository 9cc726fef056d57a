"""``_System_Credential``: every audience credential and its state, applied inline (R26);
its table, ``apply`` and rebuild kernel.

One row per credential: the audience it authenticates, the digest of its
token (never the token), when it was issued, when it expires and when it was
revoked. Inline, so a credential works (and a revocation bites) as soon as its
append commits, and on a replica as soon as that commit is replicated. Whether
a credential is *expired* depends on the reader's clock, so the view stores
the expiry and readers decide (``domain.credentials.status_at``).
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

import sqlalchemy as sa

from domain.event_types import T_CREDENTIAL_ISSUED, T_CREDENTIAL_REVOKED
from ledger.log.sqltypes import BigInt, Binary, enc
from projections.framework import Projection, Replayer, TableReplayer, ViewEvent
from projections.rows import RowStore
from projections.tables import Key, view_table

CREDENTIAL = view_table(
    "_System_Credential",
    "view_credential",
    ["credential_id"],
    sa.Column("credential_id", Binary(64)),
    sa.Column("audience_kind", Binary(16), nullable=False),
    sa.Column("audience_id", Binary(255), nullable=False),
    sa.Column("token_digest", Binary(32), nullable=False),
    sa.Column("issued_at_us", BigInt(), nullable=False),
    sa.Column("expires_at_us", BigInt(), nullable=True),
    sa.Column("revoked_at_us", BigInt(), nullable=True),
    sa.Column("position", BigInt(), nullable=False),
    # ``credentials list --audience A``.
    indexes=[["audience_kind", "audience_id"]],
)


class CredentialView(Projection):
    """Credentials by id, with the digest of their token (R26)."""

    name = "credential"
    version = 1
    weight = 0.1
    tables = (CREDENTIAL,)
    types: ClassVar[frozenset[str]] = frozenset({T_CREDENTIAL_ISSUED, T_CREDENTIAL_REVOKED})

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        key = (enc(d["credential_id"]),)
        if event.type == T_CREDENTIAL_ISSUED:
            rows.put(
                CREDENTIAL,
                {
                    "credential_id": key[0],
                    "audience_kind": enc(d["audience_kind"]),
                    "audience_id": enc(d["audience_id"]),
                    "token_digest": bytes.fromhex(d["token_digest"]),
                    "issued_at_us": int(d["issued_at_us"]),
                    "expires_at_us": d["expires_at_us"],
                    "revoked_at_us": None,
                    "position": event.position,
                },
            )
            return
        row = rows.get(CREDENTIAL, key)
        if row is None:  # a poison event: the view stops and says where (R20)
            raise ValueError(f"revocation of credential {d['credential_id']}, never issued")
        rows.put(
            CREDENTIAL,
            {**row, "revoked_at_us": int(d["revoked_at_us"]), "position": event.position},
        )

    def replayer(self, view_version: int) -> Replayer:
        return _CredentialReplay(view_version)


_CREDENTIAL_COLUMNS = (
    "credential_id",
    "audience_kind",
    "audience_id",
    "token_digest",
    "issued_at_us",
    "expires_at_us",
    "revoked_at_us",
    "position",
)
if CREDENTIAL.columns != _CREDENTIAL_COLUMNS:
    raise AssertionError("_CredentialReplay assumes the column order of CREDENTIAL")


class _CredentialReplay(TableReplayer):
    """``CredentialView.apply`` as a rebuild kernel; rows are lists (``view_version`` first)."""

    table = CREDENTIAL

    def __init__(self, view_version: int) -> None:
        super().__init__(view_version)
        rows, vv = cast(dict[Key, list[Any]], self.rows), view_version  # updated in place

        def issued(position: int, d: dict[str, Any]) -> None:
            credential_id = enc(d["credential_id"])
            rows[(credential_id,)] = [
                vv,
                credential_id,
                enc(d["audience_kind"]),
                enc(d["audience_id"]),
                bytes.fromhex(d["token_digest"]),
                int(d["issued_at_us"]),
                d["expires_at_us"],
                None,
                position,
            ]

        def revoked(position: int, d: dict[str, Any]) -> None:
            row = rows[(enc(d["credential_id"]),)]  # KeyError: apply names the poison event
            row[7] = int(d["revoked_at_us"])
            row[8] = position

        self.handlers = {T_CREDENTIAL_ISSUED: issued, T_CREDENTIAL_REVOKED: revoked}
