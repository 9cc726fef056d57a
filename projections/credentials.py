"""Reading the live credential view (R26): the credential rows, each checked for shape."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.errors import IntegrityFailure
from ledger.log.sqltypes import dec, enc
from projections.queries.status import require_running
from projections.views.credential import CREDENTIAL, CredentialView

__all__ = ["CredentialRow", "credential_rows"]


@dataclass(frozen=True, slots=True)
class CredentialRow:
    """One credential as the live view has it."""

    credential_id: str
    audience_kind: str
    audience_id: str
    token_digest: bytes
    issued_at_us: int
    expires_at_us: int | None
    revoked_at_us: int | None


def credential_rows(
    conn: Connection, *, audience: tuple[str, str] | None = None, live_only: bool = False
) -> Iterator[CredentialRow]:
    """The credentials of the live view (of one audience), oldest first; ``live_only``
    leaves revoked ones out. Fails closed when the view is not running (R25)."""
    version = require_running(conn, CredentialView.name)[CredentialView.name]
    t = CREDENTIAL.physical
    query = sa.select(t).where(t.c.view_version == version)
    if audience is not None:
        query = query.where(
            t.c.audience_kind == enc(audience[0]), t.c.audience_id == enc(audience[1])
        )
    if live_only:
        query = query.where(t.c.revoked_at_us.is_(None))
    for r in conn.execute(query.order_by(t.c.issued_at_us, t.c.credential_id)):
        yield _credential(r)


def _credential(r: Any) -> CredentialRow:
    """One stored row; a cell of another type is an edited row (INTEGRITY, R28)."""
    try:
        return CredentialRow(
            credential_id=dec(r.credential_id),
            audience_kind=dec(r.audience_kind),
            audience_id=dec(r.audience_id),
            token_digest=bytes(r.token_digest),
            issued_at_us=int(r.issued_at_us),
            expires_at_us=None if r.expires_at_us is None else int(r.expires_at_us),
            revoked_at_us=None if r.revoked_at_us is None else int(r.revoked_at_us),
        )
    except (TypeError, ValueError, AttributeError) as exc:  # UnicodeDecodeError too
        raise IntegrityFailure(
            f"a row of the credential view is not what the schema declares ({exc})",
            rule="R28",
            table="view_credential",
        ) from None
