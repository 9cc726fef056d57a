"""Audience credentials (R26) as an aggregate: issued and revoked, recorded in the log.

A credential lets a runtime read as exactly one audience. Its secret is a bearer
token of 256 random bits (URL-safe base64, made by the command side and shown
once); the log records only the token's BLAKE3 digest under a derive-key
context of its own (``Purpose.CREDENTIAL_TOKEN``). No server secret is needed:
with 2^256 possible tokens nobody can search for one whose digest matches a
stored one, so a fast unkeyed hash is as safe here as a keyed one, and the
digest recovers nothing. Neither the token nor anything that recovers it is
stored, exported or logged.

The events are self-describing (the revocation repeats the audience), so the
credential view and ``history --audience`` need nothing but the event. Times
are microseconds since the epoch from the command's clock (injected in tests),
not the event timestamp, so expiry and listings are exact and testable.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, ClassVar
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.digests import Purpose, aggregate_id, digest
from domain.errors import InvalidInput
from domain.identity import Identity, identity_problem

#: Random bytes of a token (``secrets.token_urlsafe(32)``: 43 URL-safe base64 characters).
TOKEN_BYTES = 32
#: ``credentials issue`` without ``--expires-in``.
DEFAULT_EXPIRES_IN = "90d"
#: The longest expiry ``--expires-in`` accepts (100 years); ``never`` is longer.
MAX_EXPIRES_IN_SECONDS = 36_500 * 86_400
_UNITS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
_DURATION = re.compile(r"([1-9][0-9]{0,11})([dhms])", re.ASCII)
_CREDENTIAL_ID = re.compile(r"cred_[0-9a-f]{24}", re.ASCII)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class CredentialId(Identity):
    """``cred_`` and 24 lowercase hex digits (96 random bits), made by ``issue``."""

    __slots__ = ()
    field: ClassVar[str] = "credential_id"

    @classmethod
    def problem(cls, value: object) -> str | None:
        base = identity_problem(value)
        if base is not None:
            return base
        assert isinstance(value, str)
        if not _CREDENTIAL_ID.fullmatch(value):
            return "must be a credential id: cred_ and 24 lowercase hex digits"
        return None


class CredentialStatus(StrEnum):
    ACTIVE = "active"
    REVOKED = "revoked"
    EXPIRED = "expired"


def status_at(revoked_at_us: int | None, expires_at_us: int | None, now_us: int) -> str:
    """A credential's status at ``now_us``: revoked wins over expired."""
    if revoked_at_us is not None:
        return CredentialStatus.REVOKED.value
    if expires_at_us is not None and now_us >= expires_at_us:
        return CredentialStatus.EXPIRED.value
    return CredentialStatus.ACTIVE.value


class Credential(Aggregate):
    """One credential of one audience: issued once, revoked at most once."""

    class Issued(Aggregate.Created):
        credential_id: str
        audience_kind: str
        audience_id: str
        #: Hex BLAKE3 digest of the token (``token_digest``); never the token.
        token_digest: str
        issued_at_us: int
        #: ``None``: the credential never expires.
        expires_at_us: int | None

    class Revoked(Aggregate.Event):
        credential_id: str
        audience_kind: str
        audience_id: str
        revoked_at_us: int

    @staticmethod
    def create_id(credential_id: str, **_: Any) -> UUID:
        return credential_aggregate_id(credential_id)

    @event(Issued)
    def __init__(
        self,
        credential_id: str,
        audience_kind: str,
        audience_id: str,
        token_digest: str,
        issued_at_us: int,
        expires_at_us: int | None,
    ) -> None:
        self.credential_id = credential_id
        self.audience_kind = audience_kind
        self.audience_id = audience_id
        self.token_digest = token_digest
        self.issued_at_us = issued_at_us
        self.expires_at_us = expires_at_us
        self.revoked_at_us: int | None = None

    @event(Revoked)
    def _revoked(
        self, credential_id: str, audience_kind: str, audience_id: str, revoked_at_us: int
    ) -> None:
        self.revoked_at_us = revoked_at_us

    def revoke(self, now_us: int) -> bool:
        """Revoke now; ``False`` (and no event) when it already is: revoking twice is a no-op."""
        if self.revoked_at_us is not None:
            return False
        self._revoked(
            credential_id=self.credential_id,
            audience_kind=self.audience_kind,
            audience_id=self.audience_id,
            revoked_at_us=now_us,
        )
        return True

    def status(self, now_us: int) -> str:
        return status_at(self.revoked_at_us, self.expires_at_us, now_us)


def credential_aggregate_id(credential_id: str) -> UUID:
    return aggregate_id("credential", credential_id)


def token_digest(token: str) -> bytes:
    """The digest the log holds for ``token`` (32 bytes; stored as hex)."""
    return digest(Purpose.CREDENTIAL_TOKEN, token.encode("utf-8"))


def parse_duration(text: object, *, field: str = "expires_in") -> int | None:
    """Seconds of ``90d``, ``12h``, ``30m`` or ``3600s``; ``None`` for ``never``.

    Every value that is not one of these, from 1s to ``MAX_EXPIRES_IN_SECONDS``, gets
    the one message (zero, negative, too large, not a number, too many digits alike)."""
    if not isinstance(text, str):
        raise InvalidInput(f"{field} must be a string", field=field)
    if text == "never":
        return None
    found = _DURATION.fullmatch(text)
    seconds = 0 if found is None else int(found.group(1)) * _UNITS[found.group(2)]
    if not 1 <= seconds <= MAX_EXPIRES_IN_SECONDS:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise InvalidInput(
            f"{field} must be a whole number of days, hours, minutes or seconds from 1s to "
            f"{MAX_EXPIRES_IN_SECONDS // 86_400}d, like 90d, 12h, 30m or 3600s, or never; "
            f"got {shown!r}",
            field=field,
            value=shown,
        )
    return seconds


def rfc3339(us: int | None) -> str | None:
    """Microseconds since the epoch as RFC 3339 UTC text (``…Z``); ``None`` stays ``None``."""
    if us is None:
        return None
    stamp = _EPOCH + timedelta(microseconds=us)  # exact: no float on the way
    return stamp.isoformat().replace("+00:00", "Z")


# -- client certificates (issue 16, mTLS) ---------------------------------------------------

#: A client certificate names its audience by this SAN URI prefix and ``<kind>:<id>``,
#: the id percent-encoded (RFC 3986) so that any identity survives the URI grammar.
AUDIENCE_URI_PREFIX = "catalog-ledger:audience:"
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX = "0123456789ABCDEFabcdef"
#: The other characters RFC 3986 allows unencoded in a path segment (sub-delims, ":", "@").
_PCHAR_EXTRA = "!$&'()*+,;=:@"


def audience_uri(kind: str, ident: str) -> str:
    """``catalog-ledger:audience:<kind>:<id>`` with every byte of the id outside RFC 3986's
    unreserved set percent-encoded (the form certificates are issued with)."""
    encoded = "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in ident.encode("utf-8"))
    return f"{AUDIENCE_URI_PREFIX}{kind}:{encoded}"


def parse_audience_uri(uri: str) -> tuple[str, str]:
    """(kind, id) of an audience URI, the id percent-decoded as strict UTF-8; INVALID naming
    ``certificate`` when it is not one. The caller validates the pair (R1)."""
    if not uri.startswith(AUDIENCE_URI_PREFIX):
        raise InvalidInput("not a catalog-ledger audience URI", field="certificate")
    kind, sep, encoded = uri[len(AUDIENCE_URI_PREFIX) :].partition(":")
    if not sep:
        raise InvalidInput(
            "an audience URI is catalog-ledger:audience:<kind>:<id>", field="certificate"
        )
    raw = bytearray()
    i = 0
    while i < len(encoded):
        char = encoded[i]
        if char == "%":
            pair = encoded[i + 1 : i + 3]
            if len(pair) != 2 or any(c not in _HEX for c in pair):
                raise InvalidInput(
                    "the audience id of the URI is not percent-encoded", field="certificate"
                )
            raw.append(int(pair, 16))
            i += 3
            continue
        if not char.isascii() or (ord(char) not in _UNRESERVED and char not in _PCHAR_EXTRA):
            raise InvalidInput(
                f"the audience id of the URI holds {char!r} unencoded", field="certificate"
            )
        raw += char.encode("ascii")
        i += 1
    try:
        return kind, raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(
            "the audience id of the URI is not UTF-8 once decoded", field="certificate"
        ) from None
