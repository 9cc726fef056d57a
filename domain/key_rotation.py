"""Key rotation statements of the log's signing key (R29, issue 28 item 6).

A rotation statement is a C2SP signed note by the *old* key, recorded in the log as
``log_key.rotated`` (``domain.log_identity``), whose body is::

    catalog-ledger key rotation v1
    origin <origin>
    old <verifier key text>
    new <verifier key text>
    until <unix seconds>

It is covered by every later checkpoint of the log, so the witnesses that cosign those
checkpoints cosign it too: every client is shown the same rotation (no split view of
keys). ``apply_rotation`` is the whole rule a client (or an auditor) applies to its pinned
key set. Pure: no I/O, no clock (``now`` is an argument).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from domain.errors import IntegrityFailure, InvalidInput
from domain.log_identity import check_origin
from domain.notes import SignerKey, VerifierKey, key_id

#: The first line of a rotation statement's body (its format and version).
ROTATION_HEADER = "catalog-ledger key rotation v1"


@dataclass(frozen=True)
class Rotation:
    """A parsed rotation statement (signatures not checked here)."""

    origin: str
    old: VerifierKey
    new: VerifierKey
    until: int

    def body(self) -> str:
        return (
            f"{ROTATION_HEADER}\norigin {self.origin}\nold {self.old.text()}\n"
            f"new {self.new.text()}\nuntil {self.until}\n"
        )

    @classmethod
    def parse(cls, note: str, *, field: str = "statement") -> Rotation:
        body = note.split("\n\n", 1)[0]
        lines = body.removesuffix("\n").split("\n")
        labels = [line.split(" ", 1)[0] for line in lines[1:]]
        if (
            len(lines) != 5
            or lines[0] != ROTATION_HEADER
            or labels
            != [
                "origin",
                "old",
                "new",
                "until",
            ]
        ):
            raise InvalidInput(
                f"{field} is not a key rotation statement ({ROTATION_HEADER}: origin, old, "
                "new, until)",
                field=field,
            )
        values = [line.split(" ", 1)[1] if " " in line else "" for line in lines[1:]]
        until = values[3]
        if not (until.isascii() and until.isdigit() and len(until) <= 19):
            raise InvalidInput(f"{field}: until is not unix seconds", field=field)
        return cls(
            origin=check_origin(values[0], field=field),
            old=VerifierKey.parse(values[1], field=f"{field}.old"),
            new=VerifierKey.parse(values[2], field=f"{field}.new"),
            until=int(until),
        )


def rotation_statement(origin: str, old: SignerKey, new: VerifierKey, until: int) -> str:
    """The signed rotation statement: ``old`` announces ``new``; ``old`` stays valid until
    ``until`` (unix seconds)."""
    if new.public == old.verifier.public:
        raise InvalidInput("the new key is the old key", field="new")
    return old.sign(Rotation(check_origin(origin), old.verifier, new, until).body())


@dataclass(frozen=True)
class PinnedKey:
    """A key of a pinned set; ``until`` (unix seconds) ends an old key's overlap."""

    key: VerifierKey
    until: int | None = None

    def valid_at(self, now: int) -> bool:
        return self.until is None or now <= self.until


def apply_rotation(
    pinned: Iterable[VerifierKey | PinnedKey], statement: str, *, origin: str, now: int
) -> tuple[PinnedKey, ...]:
    """The key set after a rotation statement, or INTEGRITY (nothing changes).

    The statement must be for ``origin`` (``wrong_origin``), its overlap must not be over
    at ``now`` (``expired``: a client that missed the overlap takes a new policy out of
    band, never an old key's word), and it must carry a valid signature by its ``old``
    key, which must be a pinned key valid at ``now`` (``not_pinned``, ``bad_signature``,
    ``no_signature``). The result keeps every other pinned key, gives the old key the
    statement's ``until``, and adds the new key with no end.
    """
    keys = tuple(k if isinstance(k, PinnedKey) else PinnedKey(k) for k in pinned)
    try:
        rotation = Rotation.parse(statement)
    except InvalidInput as exc:
        raise IntegrityFailure(exc.message, reason="malformed_rotation") from None
    if rotation.origin != origin:
        raise IntegrityFailure(
            f"the key rotation is for {rotation.origin!r}, not {origin!r}",
            reason="wrong_origin",
            origin=rotation.origin,
        )
    if now > rotation.until:
        raise IntegrityFailure(
            f"the key rotation's overlap ended at {rotation.until} (now {now}): the old key "
            "is no longer trusted to announce its successor; take a new policy out of band",
            reason="expired",
            until=rotation.until,
            now=now,
        )
    signer = next(
        (
            k
            for k in keys
            if k.key.public == rotation.old.public
            and k.key.name == rotation.old.name
            and k.valid_at(now)
        ),
        None,
    )
    if signer is None:
        raise IntegrityFailure(
            f"the key rotation's old key {rotation.old.text()} is not a pinned key valid now",
            reason="not_pinned",
        )
    check_signature(signer.key, statement)
    kept = tuple(k for k in keys if k.key.public not in (rotation.old.public, rotation.new.public))
    return (*kept, PinnedKey(signer.key, rotation.until), PinnedKey(rotation.new))


def check_signature(key: VerifierKey, note: str) -> None:
    """``VerifierKey.verify`` for a note whose body is not a checkpoint: INTEGRITY
    (``bad_signature``, ``no_signature``) unless ``note`` carries a valid signature by
    ``key``."""
    text, sep, signatures = note.partition("\n\n")
    if not sep:
        raise IntegrityFailure("the key rotation is not signed", reason="no_signature")
    body = (text + "\n").encode()
    wanted = key_id(key.name, key.public)
    for line in signatures.splitlines():
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != "\u2014" or parts[1] != key.name:
            continue
        try:
            raw = base64.b64decode(parts[2], validate=True)
        except ValueError:
            continue
        if raw[:4] != wanted:
            continue
        try:
            Ed25519PublicKey.from_public_bytes(key.public).verify(raw[4:], body)
        except InvalidSignature:
            raise IntegrityFailure(
                f"the key rotation's signature by {key.name} does not verify",
                reason="bad_signature",
            ) from None
        return
    raise IntegrityFailure(
        f"the key rotation has no signature by its old key {key.name}", reason="no_signature"
    )
