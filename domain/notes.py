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
"""

from __future__ import annotations

import base64
import hashlib
import re
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
        body = note.split("\n\n", 1)[0]
        lines = body.split("\n")
        size = lines[1] if len(lines) > 1 else ""
        # ASCII digits only (int() refuses '²'), and few enough for a 64-bit tree size.
        plain = size.isascii() and size.isdigit() and len(size) <= 19
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


@dataclass(frozen=True)
class VerifierKey:
    name: str
    public: bytes

    def text(self) -> str:
        body = base64.b64encode(_ED25519 + self.public).decode()
        return f"{self.name}+{key_id(self.name, self.public).hex()}+{body}"

    @classmethod
    def parse(cls, text: str, *, field: str = "key") -> VerifierKey:
        parts = text.strip().split("+", 2)  # base64 may itself contain '+'
        if len(parts) != 3 or not _NAME.fullmatch(parts[0]):
            raise InvalidInput(f"{field} is not a verifier key (name+id+key)", field=field)
        name, ident, body = parts
        try:
            raw = base64.b64decode(body, validate=True)
        except ValueError:
            raise InvalidInput(f"{field}: the key is not base64", field=field) from None
        if len(raw) != 33 or raw[:1] != _ED25519:
            raise InvalidInput(f"{field}: not an Ed25519 verifier key", field=field)
        key = cls(name, raw[1:])
        if key_id(name, key.public).hex() != ident.lower():
            raise InvalidInput(f"{field}: the key id does not match the key", field=field)
        return key

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
