"""Bearer-token authentication of runtime reads (R26), without disclosing other audiences (R19).

Every ``/v1/audiences/...`` and ``/v1/catalog/head`` request carries
``Authorization: Bearer TOKEN``. The server digests the token with the
credential context (``domain.credentials.token_digest``) and looks it up among
the live credentials of the ``credential`` view: candidates by the digest's
first 8 bytes, then the whole digest compared with ``hmac.compare_digest``.
The caller chooses the token, not its digest, so the timing of that lookup
tells nothing that brings a valid token closer (finding one would take a
BLAKE3 preimage over 2^256 tokens). A missing, malformed, unknown, revoked or expired
token is 401 UNAUTHENTICATED with ``WWW-Authenticate: Bearer``; the three
kinds of invalid token get one answer.

A valid token reads its own audience only. A request for any other audience
is turned into a read of ``NOBODY``, an audience no binding can grant (R1
forbids its id): the reader runs the very statement an unknown audience runs,
finds nothing and raises the one MISSING answer. So a token for A asking for
B gets byte for byte what an unknown audience gets, through the same code and
the same query, whether or not B exists. The comparison of the two audiences
is constant-time too, although both are the caller's to know.

Over TLS with a client CA (``ledger.http.tls``), a client certificate the
handshake verified and that names exactly one audience by SAN URI
authenticates as that audience in place of a token; sent with a token, both
must name the same audience. Any other certificate is 401.

Revocation takes effect within ``refresh`` seconds (1 s) without a restart:
the live credentials are re-read at most that often (one indexed SELECT for
the whole set), and expiry is checked against the clock on every request. On
a replica, a revocation takes effect once replicated (``/healthz`` shows the
replication lag).
"""

from __future__ import annotations

import hmac
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from domain.credentials import (
    AUDIENCE_URI_PREFIX,
    parse_audience_uri,
    token_digest,
)
from domain.digests import lp
from domain.errors import IntegrityFailure, InvalidInput, Unauthenticated
from domain.identity import Audience, AudienceKind, Identity
from ledger.http.tls import san_uris
from ledger.store import credential_log
from projections.credentials import CredentialRow, credential_rows

#: How often the live credentials are re-read: a revocation bites within this.
REFRESH_SECONDS = 1.0
#: RFC 6750 ``b64token``; tokens this release issues are 43 URL-safe base64 characters.
_BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +([A-Za-z0-9\-._~+/]{1,512}=*) *", re.ASCII)
REALM = "catalog-ledger"
#: Bytes of a digest that select candidates; the full 32 are compared in constant time.
_PREFIX = 8

#: An audience no credential names and no binding grants: its id is not canonical (R1).
NOBODY = Audience(AudienceKind.APP, Identity.trusted("\x00"))

MISSING_TOKEN = "a bearer token is required: send `Authorization: Bearer TOKEN`"
MALFORMED_TOKEN = "the Authorization header is not `Bearer TOKEN` with a well-formed token"
INVALID_TOKEN = "the bearer token is not valid: it is unknown, revoked or expired"
MISMATCH = "the client certificate and the bearer token name different audiences"


def certificate_audience(pem: str) -> Audience:
    """The one audience a (verified) client certificate names by SAN URI; a certificate
    naming none, several or a malformed one is refused (401)."""
    named = [u for u in san_uris(pem) if u.startswith(AUDIENCE_URI_PREFIX)]
    if len(named) != 1:
        raise Unauthenticated(
            f"the client certificate names {len(named)} audiences by "
            f"{AUDIENCE_URI_PREFIX}<kind>:<id> URIs; exactly one is required",
            reason="certificate",
        )
    try:
        kind, ident = parse_audience_uri(named[0])
        return Audience.of(kind, ident, field="certificate")
    except InvalidInput as exc:
        raise Unauthenticated(
            f"the client certificate's audience URI is not valid: {exc.message}",
            reason="certificate",
        ) from None


@lru_cache(maxsize=1 << 16)  # compared, not secret: computed once per audience
def _audience_key(audience: Audience) -> bytes:
    return lp(audience.kind.value.encode(), str(audience.id).encode())


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request authenticated as: one credential (or client certificate) of one
    audience."""

    #: The credential of the token; ``None`` when a client certificate alone authenticated.
    credential_id: str | None
    audience: Audience

    def scope(self, requested: Audience) -> Audience:
        """The audience to read for ``requested``: itself if it is the caller's, else
        ``NOBODY`` (the unknown audience's read and answer, R19)."""
        same = hmac.compare_digest(_audience_key(requested), _audience_key(self.audience))
        return requested if same else NOBODY


def www_authenticate(error: Unauthenticated) -> str:
    """The ``WWW-Authenticate`` challenge of a 401 (RFC 6750 section 3)."""
    reason = error.details.get("reason")
    if reason == "malformed":
        return f'Bearer realm="{REALM}", error="invalid_request"'
    if reason == "invalid_token":
        return f'Bearer realm="{REALM}", error="invalid_token"'
    return f'Bearer realm="{REALM}"'


class CredentialCache:
    """The live credentials by token digest, re-read at most every ``refresh`` seconds."""

    def __init__(
        self,
        load: Callable[[], Iterable[CredentialRow]],
        *,
        refresh: float = REFRESH_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
        confirm: Callable[[CredentialRow], None] | None = None,
    ) -> None:
        self._load = load
        #: Checks a view row against the log before it authenticates anyone (R28); each
        #: row once per load (raises INTEGRITY when the log disagrees).
        self._confirm = confirm
        self._confirmed: set[CredentialRow] = set()
        self._refresh = refresh
        self._monotonic = monotonic
        self._lock = threading.Lock()
        #: Live credentials by the first bytes of their digest; the whole digest is then
        #: compared in constant time.
        self._by_prefix: dict[bytes, tuple[CredentialRow, ...]] = {}
        self._loaded_at: float | None = None
        #: How many times the set was read (for tests and metrics).
        self.loads = 0

    def lookup(self, digest: bytes) -> CredentialRow | None:
        """The live (not revoked) credential whose token has ``digest``, if any."""
        now = self._monotonic()
        loaded = self._loaded_at
        if loaded is None or now - loaded >= self._refresh:
            with self._lock:
                if self._loaded_at is None or now - self._loaded_at >= self._refresh:
                    groups: dict[bytes, list[CredentialRow]] = {}
                    for row in self._load():
                        if row.revoked_at_us is None:
                            groups.setdefault(row.token_digest[:_PREFIX], []).append(row)
                    self._by_prefix = {k: tuple(v) for k, v in groups.items()}
                    self._confirmed = set()
                    self._loaded_at = now
                    self.loads += 1
        found = None
        for row in self._by_prefix.get(digest[:_PREFIX], ()):
            if hmac.compare_digest(row.token_digest, digest):
                found = row
        if found is not None and self._confirm is not None and found not in self._confirmed:
            self._confirm(found)
            self._confirmed.add(found)
        return found


class Authenticator:
    """Turns an ``Authorization`` header into a ``Caller``, or UNAUTHENTICATED."""

    def __init__(
        self,
        credentials: CredentialCache,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.credentials = credentials
        self.clock = clock

    def authenticate(
        self, authorization: str | None, client_certificate: str | None = None
    ) -> Caller:
        """The caller of a request: its bearer token's audience, or its client
        certificate's (verified by the TLS handshake against ``--tls-client-ca``); with
        both, they must name the same audience."""
        named = None if client_certificate is None else certificate_audience(client_certificate)
        if named is not None and (authorization is None or not authorization.strip()):
            return Caller(None, named)
        caller = self._token(authorization)
        if named is not None and named != caller.audience:
            raise Unauthenticated(MISMATCH, reason="certificate")
        return caller

    def _token(self, authorization: str | None) -> Caller:
        if authorization is None or not authorization.strip():
            raise Unauthenticated(MISSING_TOKEN, reason="missing")
        found = _BEARER.fullmatch(authorization)
        if found is None:
            raise Unauthenticated(MALFORMED_TOKEN, reason="malformed")
        row = self.credentials.lookup(token_digest(found.group(1)))
        now_us = int(self.clock() * 1_000_000)
        if row is None or (row.expires_at_us is not None and now_us >= row.expires_at_us):
            raise Unauthenticated(INVALID_TOKEN, reason="invalid_token")
        try:
            kind = AudienceKind(row.audience_kind)
        except ValueError:  # the issue validated it: the view row was edited (R21)
            raise IntegrityFailure(
                f"credential {row.credential_id} names audience kind {row.audience_kind!r} "
                "in the credential view; `catalog-ledger projections verify credential`",
                view="credential",
            ) from None
        return Caller(row.credential_id, Audience(kind, Identity.trusted(row.audience_id)))


def log_confirmer(ledger: Any) -> Callable[[CredentialRow], None]:
    """Checks a live credential row of the view against the credential's events (R28,
    ``ledger.store.credential_log``): a row the log does not confirm (edited, forged,
    or revoked in the log) is INTEGRITY naming ``view_credential`` — never a caller."""

    def confirm(row: CredentialRow) -> None:
        with ledger.db.read() as conn:
            credential_log.confirm(ledger.recorder, conn, [row])

    return confirm


def view_loader(db: Any) -> Callable[[], list[CredentialRow]]:
    """Reads the live credentials of the store's ``credential`` view (one SELECT; fails
    closed, typed, when the view is not running)."""

    def load() -> list[CredentialRow]:
        with db.read() as conn:
            return list(credential_rows(conn, live_only=True))

    return load
