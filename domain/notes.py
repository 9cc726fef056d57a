"""Signed notes (C2SP ``signed-note``): ``tlog-checkpoint`` text and Ed25519 signatures.

Pure (no I/O): the runtime client verifies checkpoints with it (R29).

A checkpoint commits to the log's size and Merkle root (R22)::

    <origin>
    <tree size>
    <base64 root hash>

A signed note appends a blank line and one line per signature,
``— <key name> <base64(key id || signature)>``; the key id is the first four
bytes of SHA-256(name || "\\n" || 0x01 || public key), 0x01 naming Ed25519.
Keys use the ``note`` text forms: ``PRIVATE+KEY+<name>+<id hex>+<base64(0x01||seed)>``
for signers and ``<name>+<id hex>+<base64(0x01||public key)>`` for verifiers, so
third-party tools that read C2SP signed notes can check our checkpoints.

Witnesses cosign checkpoints (C2SP ``tlog-cosignature``, ``cosignature/v1``): an
Ed25519 signature of ``cosignature/v1\ntime <t>\n`` followed by the checkpoint body,
written as a note signature line whose bytes are key id || u64 big-endian timestamp ||
signature, the key id SHA-256(name || "\n" || 0x04 || public key)[:4]. ``WitnessSigner``
makes them, ``WitnessKey`` (vkey type 0x04) checks them, and ``verify_cosignatures``
returns each pinned witness's timestamp from a note. ``SignedNote`` parses any signed
note as the spec does (the text ends at the *last* blank line).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from domain.errors import IntegrityFailure, InvalidInput

_ED25519 = b"\x01"
_NAME = re.compile(r"[^\s+]+")
_DASH = "\u2014"


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes

    def text(self) -> str:
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode()}\n"

    @classmethod
    def parse(cls, note: str, *, field: str = "checkpoint") -> Checkpoint:
        """The checkpoint in a (possibly signed) note; signatures are not checked here."""
        body, _, signatures = note.partition("\n\n")
        if "\n\n" in signatures:
            # signed-note: the text ends at the *last* blank line, and a checkpoint's text
            # has none: two bodies are no checkpoint (the first may not be what is signed).
            raise InvalidInput(f"{field} has a blank line in its text", field=field)
        lines = body.split("\n")
        size = lines[1] if len(lines) > 1 else ""
        # ASCII digits only (int() refuses '²'), and few enough for a 64-bit tree size.
        # tlog-checkpoint: decimal with no leading zeroes ("0" alone for an empty log).
        plain = size.isascii() and size.isdigit() and len(size) <= 19
        plain = plain and (size == "0" or not size.startswith("0"))
        if len(lines) < 3 or not lines[0] or not plain:
            raise InvalidInput(
                f"{field} is not a tlog-checkpoint (origin, size, base64 root)", field=field
            )
        try:
            root = base64.b64decode(lines[2], validate=True)
        except ValueError:
            raise InvalidInput(f"{field}: the root hash is not base64", field=field) from None
        if len(root) != 32:
            raise InvalidInput(f"{field}: the root hash is not 32 bytes", field=field)
        return cls(lines[0], int(lines[1]), root)


def key_id(name: str, public: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + _ED25519 + public).digest()[:4]


def _verifier_key(
    text: str, field: str, kind: bytes, ident_of: Callable[[str, bytes], bytes], what: str
) -> tuple[str, bytes]:
    """The name and public key of a signed-note verifier key ``<name>+<key id
    hex>+<base64(type byte || public key)>`` of type ``kind``; INVALID naming ``field``."""
    parts = text.strip().split("+", 2)  # base64 may itself contain '+'
    if len(parts) != 3 or not _NAME.fullmatch(parts[0]):
        raise InvalidInput(f"{field} is not a verifier key (name+id+key)", field=field)
    name, ident, body = parts
    try:
        raw = base64.b64decode(body, validate=True)
    except ValueError:
        raise InvalidInput(f"{field}: the key is not base64", field=field) from None
    if len(raw) != 33 or raw[:1] != kind:
        raise InvalidInput(f"{field}: not {what}", field=field)
    if ident_of(name, raw[1:]).hex() != ident.lower():
        raise InvalidInput(f"{field}: the key id does not match the key", field=field)
    return name, raw[1:]


@dataclass(frozen=True)
class VerifierKey:
    name: str
    public: bytes

    def text(self) -> str:
        body = base64.b64encode(_ED25519 + self.public).decode()
        return f"{self.name}+{key_id(self.name, self.public).hex()}+{body}"

    @classmethod
    def parse(cls, text: str, *, field: str = "key") -> VerifierKey:
        name, public = _verifier_key(text, field, _ED25519, key_id, "an Ed25519 verifier key")
        return cls(name, public)

    def verify(self, note: str) -> Checkpoint:
        """The checkpoint, if ``note`` carries a valid signature by this key."""
        text, sep, signatures = note.partition("\n\n")
        if not sep:
            raise IntegrityFailure("the checkpoint is not signed", reason="unsigned")
        text += "\n"
        public = Ed25519PublicKey.from_public_bytes(self.public)
        wanted = key_id(self.name, self.public)
        for line in signatures.splitlines():
            parts = line.split(" ")
            if len(parts) != 3 or parts[0] != _DASH or parts[1] != self.name:
                continue
            try:
                raw = base64.b64decode(parts[2], validate=True)
            except ValueError:
                continue
            if raw[:4] != wanted:
                continue
            try:
                public.verify(raw[4:], text.encode())
            except InvalidSignature:
                raise IntegrityFailure(
                    f"the signature by {self.name} does not verify", reason="bad_signature"
                ) from None
            return Checkpoint.parse(text)
        raise IntegrityFailure(
            f"the checkpoint has no signature by {self.name}", reason="no_signature"
        )


@dataclass(frozen=True)
class SignerKey:
    name: str
    seed: bytes

    @classmethod
    def generate(cls, name: str) -> SignerKey:
        if not _NAME.fullmatch(name):
            raise InvalidInput("a key name has no spaces or '+'", field="name")
        private = Ed25519PrivateKey.generate()
        return cls(name, private.private_bytes_raw())

    @property
    def verifier(self) -> VerifierKey:
        public = Ed25519PrivateKey.from_private_bytes(self.seed).public_key()
        return VerifierKey(self.name, public.public_bytes(Encoding.Raw, PublicFormat.Raw))

    def text(self) -> str:
        ident = key_id(self.name, self.verifier.public).hex()
        body = base64.b64encode(_ED25519 + self.seed).decode()
        return f"PRIVATE+KEY+{self.name}+{ident}+{body}"

    @classmethod
    def parse(cls, text: str, *, field: str = "sign") -> SignerKey:
        parts = text.strip().split("+", 4)  # base64 may itself contain '+'
        if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"]:
            raise InvalidInput(f"{field} is not a signer key (PRIVATE+KEY+…)", field=field)
        try:
            raw = base64.b64decode(parts[4], validate=True)
        except ValueError:
            raise InvalidInput(f"{field}: the key is not base64", field=field) from None
        if len(raw) != 33 or raw[:1] != _ED25519:
            raise InvalidInput(f"{field}: not an Ed25519 signer key", field=field)
        key = cls(parts[2], raw[1:])
        if key.verifier.text().split("+")[1] != parts[3].lower():
            raise InvalidInput(f"{field}: the key id does not match the key", field=field)
        return key

    def sign(self, text: str) -> str:
        """``text`` (ending in a newline) as a signed note."""
        private = Ed25519PrivateKey.from_private_bytes(self.seed)
        signature = private.sign(text.encode())
        ident = key_id(self.name, self.verifier.public)
        return f"{text}\n{_DASH} {self.name} {base64.b64encode(ident + signature).decode()}\n"


# --------------------------------------------------------------------------- signed notes

_MAX_SIGNATURES = 100  # signed-note: verifiers MUST accept at least 16


@dataclass(frozen=True)
class NoteSignature:
    """One signature line, ``— <name> base64(key id || signature)``."""

    name: str
    key_id: bytes
    signature: bytes

    def line(self) -> str:
        """The line, without its final newline."""
        return f"{_DASH} {self.name} {base64.b64encode(self.key_id + self.signature).decode()}"

    @classmethod
    def parse_line(cls, line: str, *, field: str = "signature") -> NoteSignature:
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != _DASH or not _NAME.fullmatch(parts[1]):
            raise InvalidInput(f"{field} is not a note signature line (— name base64)", field=field)
        try:
            raw = base64.b64decode(parts[2], validate=True)
        except ValueError:
            raise InvalidInput(f"{field}: the signature is not base64", field=field) from None
        if len(raw) < 5:
            raise InvalidInput(f"{field}: the signature is too short", field=field)
        return cls(parts[1], raw[:4], raw[4:])


@dataclass(frozen=True)
class SignedNote:
    """A C2SP signed note: ``text`` (ending in a newline), a blank line, signature lines.

    The text is separated from the signatures by the *last* blank line (signed-note
    "Format"); a note is UTF-8 without control characters other than newline, and has at
    least one signature line. Unknown signatures are kept as they are: verifiers ignore
    them, and :meth:`render` writes them back byte for byte.
    """

    text: str
    signatures: tuple[NoteSignature, ...]

    @classmethod
    def parse(cls, note: str, *, field: str = "note") -> SignedNote:
        if any(ord(c) < 0x20 and c != "\n" for c in note) or not _encodable(note):
            raise InvalidInput(f"{field} holds control characters or is not UTF-8", field=field)
        split = note.rfind("\n\n")
        if split < 0 or not note.endswith("\n"):
            raise InvalidInput(
                f"{field} is not a signed note (text, blank line, signatures)", field=field
            )
        lines = note[split + 2 : -1].split("\n")
        if len(lines) > _MAX_SIGNATURES:
            raise InvalidInput(f"{field} has more than {_MAX_SIGNATURES} signatures", field=field)
        signatures = tuple(NoteSignature.parse_line(line, field=field) for line in lines)
        return cls(note[: split + 1], signatures)

    def render(self) -> str:
        return self.text + "\n" + "".join(s.line() + "\n" for s in self.signatures)

    def with_signatures(self, lines: Iterable[str], *, field: str = "signature") -> SignedNote:
        """This note with ``lines`` added; a line by a key (name and key id) that already
        signed replaces that key's line (a fresh cosignature replaces an old one)."""
        added = [NoteSignature.parse_line(line.rstrip("\n"), field=field) for line in lines]
        keys = {(s.name, s.key_id) for s in added}
        kept = tuple(s for s in self.signatures if (s.name, s.key_id) not in keys)
        return SignedNote(self.text, kept + tuple(added))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return False
    return True


def add_cosignatures(note: str, lines: Iterable[str]) -> str:
    """``note`` with the cosignature ``lines`` (as ``add-checkpoint`` returns them) added,
    each replacing an older line by the same witness key."""
    return SignedNote.parse(note, field="checkpoint").with_signatures(lines).render()


# --------------------------------------------------------------------------- cosignatures

COSIGNATURE_V1 = b"\x04"
"""Signature type of tlog-cosignature's Ed25519 ``cosignature/v1`` (signed-note types)."""

_MAX_TIMESTAMP = 2**63 - 1
_COSIGNATURE_SIZE = 8 + 64  # u64 timestamp || Ed25519 signature


def cosignature_key_id(name: str, public: bytes) -> bytes:
    """tlog-cosignature: ``SHA-256(<name> || "\\n" || 0x04 || public key)[:4]``."""
    return hashlib.sha256(name.encode() + b"\n" + COSIGNATURE_V1 + public).digest()[:4]


def cosigned_message(body: str, timestamp: int) -> bytes:
    """The message a ``cosignature/v1`` signs: ``cosignature/v1``, ``time <timestamp>``,
    then the whole checkpoint body (its final newline included, no signature lines)."""
    _checkpoint_body(body)
    if not 0 <= timestamp <= _MAX_TIMESTAMP:
        raise InvalidInput("a cosignature timestamp is 0 .. 2^63-1", field="timestamp")
    return f"cosignature/v1\ntime {timestamp}\n{body}".encode()


def _checkpoint_body(body: str, field: str = "body") -> None:
    if not body.endswith("\n") or "\n\n" in body:
        raise InvalidInput(f"{field}: a checkpoint body ends in one newline", field=field)
    Checkpoint.parse(body, field=field)


def cosignature_timestamp(signature: NoteSignature) -> int:
    """The timestamp a ``cosignature/v1`` carries (not verified here)."""
    if len(signature.signature) != _COSIGNATURE_SIZE:
        raise IntegrityFailure(
            f"the cosignature by {signature.name} is not {_COSIGNATURE_SIZE} bytes",
            reason="bad_cosignature",
            witness=signature.name,
        )
    timestamp = int.from_bytes(signature.signature[:8], "big")
    if timestamp > _MAX_TIMESTAMP:
        raise IntegrityFailure(
            f"the cosignature by {signature.name} has a timestamp past 2^63-1",
            reason="bad_cosignature",
            witness=signature.name,
        )
    return timestamp


@dataclass(frozen=True)
class WitnessKey:
    """A witness's ``cosignature/v1`` verifier key: ``<name>+<id hex>+base64(0x04 || pub)``."""

    name: str
    public: bytes

    @property
    def key_id(self) -> bytes:
        return cosignature_key_id(self.name, self.public)

    def text(self) -> str:
        body = base64.b64encode(COSIGNATURE_V1 + self.public).decode()
        return f"{self.name}+{self.key_id.hex()}+{body}"

    @classmethod
    def parse(cls, text: str, *, field: str = "key") -> WitnessKey:
        kind = "a cosignature/v1 verifier key (type 0x04, Ed25519)"
        name, public = _verifier_key(text, field, COSIGNATURE_V1, cosignature_key_id, kind)
        return cls(name, public)

    def signed(self, signature: NoteSignature) -> bool:
        """Whether ``signature`` names this key (its name and key id)."""
        return signature.name == self.name and signature.key_id == self.key_id

    def verify(self, body: str, signature: NoteSignature) -> int:
        """The timestamp of ``signature``, a valid cosignature by this key of ``body``;
        INTEGRITY ``bad_cosignature`` otherwise."""
        if not self.signed(signature):
            raise IntegrityFailure(
                f"the signature is not by witness {self.name}",
                reason="bad_cosignature",
                witness=self.name,
            )
        timestamp = cosignature_timestamp(signature)
        try:
            Ed25519PublicKey.from_public_bytes(self.public).verify(
                signature.signature[8:], cosigned_message(body, timestamp)
            )
        except InvalidSignature:
            raise IntegrityFailure(
                f"the cosignature by {self.name} does not verify",
                reason="bad_cosignature",
                witness=self.name,
            ) from None
        return timestamp


@dataclass(frozen=True)
class WitnessSigner:
    """A witness's private key. Its text form is the ``note`` signer key form with type
    0x04, ``PRIVATE+KEY+<name>+<id hex>+base64(0x04 || seed)``; an Ed25519 signer key of
    type 0x01 (``note.GenerateKey``) is read too, as transparency-dev's witness reads it."""

    name: str
    seed: bytes

    @classmethod
    def generate(cls, name: str) -> WitnessSigner:
        if not _NAME.fullmatch(name):
            raise InvalidInput("a key name has no spaces or '+'", field="name")
        return cls(name, Ed25519PrivateKey.generate().private_bytes_raw())

    @property
    def verifier(self) -> WitnessKey:
        public = Ed25519PrivateKey.from_private_bytes(self.seed).public_key()
        return WitnessKey(self.name, public.public_bytes(Encoding.Raw, PublicFormat.Raw))

    def text(self) -> str:
        body = base64.b64encode(COSIGNATURE_V1 + self.seed).decode()
        return f"PRIVATE+KEY+{self.name}+{self.verifier.key_id.hex()}+{body}"

    @classmethod
    def parse(cls, text: str, *, field: str = "key") -> WitnessSigner:
        parts = text.strip().split("+", 4)  # base64 may itself contain '+'
        if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"] or not _NAME.fullmatch(parts[2]):
            raise InvalidInput(f"{field} is not a signer key (PRIVATE+KEY+…)", field=field)
        try:
            raw = base64.b64decode(parts[4], validate=True)
        except ValueError:
            raise InvalidInput(f"{field}: the key is not base64", field=field) from None
        if len(raw) != 33 or raw[:1] not in (COSIGNATURE_V1, _ED25519):
            raise InvalidInput(f"{field}: not an Ed25519 signer key", field=field)
        key = cls(parts[2], raw[1:])
        public = key.verifier.public
        wanted = key.verifier.key_id if raw[:1] == COSIGNATURE_V1 else key_id(key.name, public)
        if wanted.hex() != parts[3].lower():
            raise InvalidInput(f"{field}: the key id does not match the key", field=field)
        return key

    def cosign(self, body: str, timestamp: int) -> str:
        """The ``cosignature/v1`` line (no final newline) over the checkpoint ``body``
        at ``timestamp`` (POSIX seconds, 1 .. 2^63-1: a witness never omits it)."""
        if timestamp < 1:
            raise InvalidInput("a witness cosignature has a timestamp > 0", field="timestamp")
        message = cosigned_message(body, timestamp)
        signature = Ed25519PrivateKey.from_private_bytes(self.seed).sign(message)
        stamped = timestamp.to_bytes(8, "big") + signature
        return NoteSignature(self.name, self.verifier.key_id, stamped).line()


def verify_cosignatures(
    note: str, witnesses: Iterable[WitnessKey], *, field: str = "checkpoint"
) -> dict[WitnessKey, int]:
    """Each pinned witness with a valid cosignature on ``note``, with its timestamp (the
    newest, should a witness have several lines). Lines by other keys are ignored (a
    name or a key id alone does not make a line a pinned witness's); a line by a pinned
    key that does not verify is INTEGRITY ``bad_cosignature`` (signed-note: a known
    key's signature MUST verify). An empty result is for the caller's threshold."""
    parsed = SignedNote.parse(note, field=field)
    _checkpoint_body(parsed.text, field)
    pinned = {(w.name, w.key_id): w for w in witnesses}
    valid: dict[WitnessKey, int] = {}
    for signature in parsed.signatures:
        witness = pinned.get((signature.name, signature.key_id))
        if witness is not None:
            timestamp = witness.verify(parsed.text, signature)
            valid[witness] = max(timestamp, valid.get(witness, 0))
    return valid


def witnessed_times(
    note: str,
    witnesses: Iterable[WitnessKey],
    threshold: int,
    *,
    field: str = "checkpoint",
    what: str = "the checkpoint",
) -> list[int]:
    """The newest valid cosignature time of each pinned witness that cosigned ``note``,
    newest first; at least ``threshold`` of them, else INTEGRITY ``too_few_cosignatures``.
    A witness is its *name*: one pinned with two keys (its old and new key during a
    rotation) that cosigned with both counts once. The one count of the bundles' and the
    key rotations' k witnesses (``verify_cosignatures``' errors propagate)."""
    newest: dict[str, int] = {}
    for witness, timestamp in verify_cosignatures(note, witnesses, field=field).items():
        newest[witness.name] = max(timestamp, newest.get(witness.name, 0))
    if len(newest) < threshold:
        raise IntegrityFailure(
            f"{len(newest)} pinned witnesses cosigned {what}, the policy needs {threshold}",
            reason="too_few_cosignatures",
            cosigned=len(newest),
            threshold=threshold,
        )
    return sorted(newest.values(), reverse=True)


def note_signers(parsed: SignedNote, keys: Iterable[VerifierKey]) -> list[VerifierKey]:
    """The keys among ``keys`` that validly signed ``parsed``, in line order. Lines by
    other keys are ignored; a line naming one of ``keys`` (name and key id) whose
    signature does not verify is INTEGRITY ``bad_signature``."""
    pinned = {(k.name, key_id(k.name, k.public)): k for k in keys}
    valid: list[VerifierKey] = []
    for signature in parsed.signatures:
        key = pinned.get((signature.name, signature.key_id))
        if key is None:
            continue
        try:
            Ed25519PublicKey.from_public_bytes(key.public).verify(
                signature.signature, parsed.text.encode()
            )
        except InvalidSignature:
            raise IntegrityFailure(
                f"the signature by {key.name} does not verify", reason="bad_signature"
            ) from None
        if key not in valid:
            valid.append(key)
    return valid


def verify_log_signatures(
    note: str, keys: Iterable[VerifierKey], *, field: str = "checkpoint"
) -> tuple[Checkpoint, list[VerifierKey]]:
    """The checkpoint of ``note`` and the log keys among ``keys`` that validly signed it.

    Lines by other keys are ignored; a line naming one of ``keys`` (name and key id)
    whose signature does not verify is INTEGRITY ``bad_signature``; no valid signature by
    any of ``keys`` is INTEGRITY ``no_signature`` (signed-note "Signatures")."""
    parsed = SignedNote.parse(note, field=field)
    checkpoint = Checkpoint.parse(parsed.text, field=field)
    pinned = list(keys)
    valid = note_signers(parsed, pinned)
    if not valid:
        names = sorted({k.name for k in pinned})
        raise IntegrityFailure(
            f"the checkpoint has no signature by a pinned log key ({', '.join(names)})",
            reason="no_signature",
        )
    return checkpoint, valid
