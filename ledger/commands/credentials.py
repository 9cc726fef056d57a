"""``credentials issue | revoke | list``: audience credentials, recorded in the log (R26).

Issuing appends one ``credential.issued`` event holding the credential id, the
audience, the expiry and the BLAKE3 digest of a fresh token; the token itself
is returned once, to the caller, and exists nowhere else. There is therefore
no idempotent retry of ``issue`` (a retry could not show the token again, and
recording the result would store it): each call is a new credential.
Revoking appends one ``credential.revoked`` event, fenced on the version it
read; revoking a revoked credential appends nothing, and an unknown id is
MISSING. Neither needs the writer lease: each is one append of one aggregate of
its own, guarded by the aggregate's version like any optimistic write, and
touching no pack (R12 is about multi-step work on packs).

Times come from the service clock (injected in tests); expiry is decided at
read time against the reader's clock.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TypedDict

from domain.credentials import (
    DEFAULT_EXPIRES_IN,
    TOKEN_BYTES,
    Credential,
    CredentialId,
    credential_aggregate_id,
    parse_duration,
    rfc3339,
    status_at,
    token_digest,
)
from domain.errors import Conflict, Missing
from domain.identity import Audience
from ledger.observability import get_logger, logged_command
from ledger.store import credential_log
from ledger.store.runtime import Ledger
from projections.credentials import CredentialRow, credential_rows
from projections.queries.status import require_running
from projections.views.credential import CredentialView

log = get_logger("credentials")

#: How often a revocation re-reads after losing a race (the winner revoked it: a no-op).
_REVOKE_ATTEMPTS = 3


class IssuedCredential(TypedDict):
    """``credentials issue``: the only place the token ever appears."""

    credential_id: str
    audience: str
    token: str
    issued_at: str
    expires_at: str | None  # RFC 3339 UTC; null: never


class CredentialInfo(TypedDict):
    """One credential as ``credentials list`` shows it: no secret, no digest."""

    credential_id: str
    audience: str
    status: str  # active | revoked | expired
    issued_at: str
    expires_at: str | None
    revoked_at: str | None


class RevokedCredential(CredentialInfo):
    """``credentials revoke``: the credential after it, and whether this call revoked it."""

    noop: bool


class CredentialList(TypedDict):
    credentials: list[CredentialInfo]


def _info(
    credential_id: str,
    audience: str,
    issued_at_us: int,
    expires_at_us: int | None,
    revoked_at_us: int | None,
    now_us: int,
) -> CredentialInfo:
    issued = rfc3339(issued_at_us)
    assert issued is not None
    return {
        "credential_id": credential_id,
        "audience": audience,
        "status": status_at(revoked_at_us, expires_at_us, now_us),
        "issued_at": issued,
        "expires_at": rfc3339(expires_at_us),
        "revoked_at": rfc3339(revoked_at_us),
    }


def _row_info(row: CredentialRow, now_us: int) -> CredentialInfo:
    return _info(
        row.credential_id,
        f"{row.audience_kind}:{row.audience_id}",
        row.issued_at_us,
        row.expires_at_us,
        row.revoked_at_us,
        now_us,
    )


class CredentialHandler:
    """Issuing, revoking and listing audience credentials, with times from ``clock``."""

    def __init__(self, ledger: Ledger, *, clock: Callable[[], float]) -> None:
        self.ledger = ledger
        self.clock = clock

    def _now_us(self) -> int:
        return int(self.clock() * 1_000_000)

    # The final log record names the credential, never its token (R26).
    @logged_command(
        log,
        "credentials-issue",
        lambda r: {k: r[k] for k in ("credential_id", "audience", "expires_at")},
    )
    def credentials_issue(
        self, audience: str, *, expires_in: str = DEFAULT_EXPIRES_IN
    ) -> IssuedCredential:
        """A new credential for ``audience``; its token is in the result and nowhere else."""
        parsed = Audience.parse(audience, field="audience")
        seconds = parse_duration(expires_in, field="expires_in")
        with self.ledger.db.read() as conn:
            # A credential that no server could check is refused before it is written.
            require_running(conn, CredentialView.name)
        token = secrets.token_urlsafe(TOKEN_BYTES)
        credential_id = "cred_" + secrets.token_hex(12)
        now = self._now_us()
        expires = None if seconds is None else now + seconds * 1_000_000
        credential = Credential(
            credential_id=credential_id,
            audience_kind=parsed.kind.value,
            audience_id=str(parsed.id),
            token_digest=token_digest(token).hex(),
            issued_at_us=now,
            expires_at_us=expires,
        )
        self.ledger.app.save(credential, fence={credential.id: 0})
        issued = rfc3339(now)
        assert issued is not None
        return {
            "credential_id": credential_id,
            "audience": parsed.text,
            "token": token,
            "issued_at": issued,
            "expires_at": rfc3339(expires),
        }

    @logged_command(
        log,
        "credentials-revoke",
        lambda r: {"credential_id": r["credential_id"], "noop": r["noop"]},
    )
    def credentials_revoke(self, credential_id: str) -> RevokedCredential:
        """Revoke a credential (MISSING if unknown; a no-op if already revoked)."""
        cid = CredentialId(credential_id, field="credential_id")
        for _ in range(_REVOKE_ATTEMPTS):
            with self.ledger.snapshot() as reader:
                credential = reader.get(credential_aggregate_id(cid), Credential)
            if credential is None:
                raise Missing(f"credential {cid} does not exist", credential_id=str(cid))
            read_at = credential.version
            now = self._now_us()
            revoked = credential.revoke(now)
            if revoked:
                try:
                    self.ledger.app.save(credential, fence={credential.id: read_at})
                except Conflict:
                    continue  # revoked meanwhile by another caller: read again (a no-op)
            info = _info(
                credential.credential_id,
                f"{credential.audience_kind}:{credential.audience_id}",
                credential.issued_at_us,
                credential.expires_at_us,
                credential.revoked_at_us,
                now,
            )
            return {**info, "noop": not revoked}
        raise Conflict(
            f"credential {cid} kept changing while it was being revoked", credential_id=str(cid)
        )

    def credentials_list(self, *, audience: str | None = None) -> CredentialList:
        """Every credential (of ``audience``) with its status; never a token or digest."""
        scope = None
        if audience is not None:
            parsed = Audience.parse(audience, field="audience")
            scope = (parsed.kind.value, str(parsed.id))
        now = self._now_us()
        with self.ledger.db.read() as conn:
            rows = list(credential_rows(conn, audience=scope))
            credential_log.confirm(self.ledger.recorder, conn, rows)  # R28
        return {"credentials": [_row_info(r, now) for r in rows]}
