"""Credential rows of the view checked against the credential's events (R28).

The ``credential`` view is a cache: before a row authenticates a caller (HTTP) or is
listed (``credentials list``), the credential's first event must be the
``credential.issued`` that row describes, and its last event must say what the row says
about revocation. A row the log does not confirm is INTEGRITY naming ``view_credential``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection

from domain.credentials import credential_aggregate_id
from domain.errors import IntegrityFailure
from domain.event_types import T_CREDENTIAL_ISSUED, T_CREDENTIAL_REVOKED
from projections import checks
from projections.credentials import CredentialRow


def confirm(recorder: Any, conn: Connection, rows: Sequence[CredentialRow]) -> None:
    """Raise INTEGRITY for the first of ``rows`` the log does not confirm."""
    if not rows or not checks.on(checks.CREDENTIAL):
        return
    ids = [credential_aggregate_id(r.credential_id) for r in rows]
    first = recorder.first_events(conn, ids)
    last = recorder.last_events(conn, ids)
    for row, aggregate in zip(rows, ids, strict=True):
        problem = _problem(row, first.get(aggregate), last.get(aggregate))
        if problem is not None:
            raise IntegrityFailure(
                f"credential {row.credential_id} of the credential view is not what the log "
                f"says ({problem}): a view row was edited or added; `catalog-ledger "
                "projections rebuild credential` restores it from the log",
                rule="R28",
                table="view_credential",
                key={"credential_id": row.credential_id},
            )


def _problem(row: CredentialRow, first: Any, last: Any) -> str | None:
    if first is None or first.type != T_CREDENTIAL_ISSUED or last is None:
        return "the log issued no such credential"
    issued = first.data
    expected = {
        "credential_id": row.credential_id,
        "audience_kind": row.audience_kind,
        "audience_id": row.audience_id,
        "token_digest": row.token_digest.hex(),
        "issued_at_us": row.issued_at_us,
        "expires_at_us": row.expires_at_us,
    }
    for name, value in expected.items():
        if issued.get(name) != value:
            return f"{name} differs from the issue"
    if row.revoked_at_us is None:
        return "the log revoked it" if last.type == T_CREDENTIAL_REVOKED else None
    if last.type != T_CREDENTIAL_REVOKED or last.data.get("revoked_at_us") != row.revoked_at_us:
        return "the log did not revoke it then"
    return None
