"""The last line of an ``export --jsonl`` (schema/LOG-FORMAT.md, "Trailer").

An export without an end marker cannot tell a complete backup from one cut at a
line boundary: every prefix of a valid export is itself a valid export. The
trailer closes that gap. It states how many event lines precede it, the head
row (position and chain) the export was read against, and the RFC 9162 Merkle
root over the exported event ids (``merkle.leaf_hash`` / ``merkle.MerkleStack``,
the definitions checkpoints and proofs use; no digest is defined here). An
import compares it with what it loaded and refuses a file whose trailer is
missing, repeated, not last or different.

It detects truncation and accidents, not malice: whoever rewrites a file can
rewrite its trailer. A signed checkpoint in the export belongs to the
verifiable-reads work (R29).

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from domain.errors import IntegrityFailure, InvalidInput

#: The key that marks a line as the trailer; its value is the trailer's format version.
MARKER = "trailer"
VERSION = 1
#: Version 2 (R29): the export carries checkpoint lines (``ledger.log.checkpoint_line``)
#: and the trailer counts them (``checkpoints``). An export without any writes version 1,
#: byte for byte as before, so every reader of version 1 still reads it.
VERSION_CHECKPOINTS = 2
FIELDS = (MARKER, "count", "head_position", "head_chain", "root", "damaged")
FIELDS_V2 = (*FIELDS, "checkpoints")
_MAX_INT = 2**63 - 1


@dataclass(frozen=True)
class Trailer:
    """``count`` event lines precede the trailer; the export read the head row at
    ``head_position`` / ``head_chain``; ``root`` is the Merkle root over the event ids
    of those lines; ``damaged`` of them hold stored values the export flagged (24.3:
    such an export is complete but exits 6). ``None`` marks a value the damaged store
    could not give (a head row or event id of the wrong type)."""

    count: int
    head_position: int | None
    head_chain: bytes | None
    root: bytes | None
    damaged: int = 0
    #: Checkpoint lines between the event lines and the trailer (version 2 when > 0).
    checkpoints: int = 0

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            MARKER: VERSION_CHECKPOINTS if self.checkpoints else VERSION,
            "count": self.count,
            "head_position": self.head_position,
            "head_chain": None if self.head_chain is None else self.head_chain.hex(),
            "root": None if self.root is None else base64.b64encode(self.root).decode("ascii"),
            "damaged": self.damaged,
        }
        if self.checkpoints:
            document["checkpoints"] = self.checkpoints
        return document

    @classmethod
    def parse(cls, doc: dict[str, Any], *, line: int) -> Trailer:
        """The trailer in a line's JSON object (one holding ``"trailer"``).

        A field of the wrong JSON type is INVALID naming ``trailer.<field>``; a trailer
        version this release does not read is INTEGRITY (an unknown format version)."""
        version = doc[MARKER]
        if type(version) is not int or version not in (VERSION, VERSION_CHECKPOINTS):
            raise IntegrityFailure(
                f"line {line}: trailer version {version!r} is not one this release reads "
                f"({VERSION}, {VERSION_CHECKPOINTS}); nothing was imported",
                line=line,
                field=f"{MARKER}.{MARKER}",
                check="trailer",
            )
        unknown = sorted(set(doc) - set(FIELDS if version == VERSION else FIELDS_V2))
        if unknown:
            raise _invalid(line, unknown[0], "is not a trailer field")
        count, damaged = _count(doc, "count", line), _count(doc, "damaged", line)
        checkpoints = 0 if version == VERSION else _count(doc, "checkpoints", line)
        null = "head_position" in doc and doc["head_position"] is None
        position = None if null else _count(doc, "head_position", line)
        return cls(
            count=count,
            head_position=position,
            head_chain=_digest(doc, "head_chain", line, _hex32),
            root=_digest(doc, "root", line, _b64_32),
            damaged=damaged,
            checkpoints=checkpoints,
        )


def is_trailer(doc: object) -> bool:
    """Whether a parsed export line is a trailer (an object with the marker key)."""
    return isinstance(doc, dict) and MARKER in doc


def _invalid(line: int, key: str, problem: str) -> InvalidInput:
    return InvalidInput(
        f"line {line}: trailer field {key} {problem}", field=f"{MARKER}.{key}", line=line
    )


def _count(doc: dict[str, Any], key: str, line: int) -> int:
    if key not in doc:
        raise _invalid(line, key, "is missing")
    value = doc[key]
    if type(value) is not int or not 0 <= value <= _MAX_INT:
        raise _invalid(line, key, f"must be an integer between 0 and 2^63-1, found {_json(value)}")
    return value


def _json(value: object) -> str:
    return "null" if value is None else repr(value)


def _digest(doc: dict[str, Any], key: str, line: int, decode: Any) -> bytes | None:
    """A digest field; null is allowed (a damaged store's export could not give it)."""
    if key not in doc:
        raise _invalid(line, key, "is missing")
    value = doc[key]
    if value is None:
        return None
    if not isinstance(value, str):
        raise _invalid(line, key, f"must be a string or null, found {_json(value)}")
    decoded: bytes | None = decode(value)
    if decoded is None:
        raise _invalid(line, key, f"is not {decode.__doc__}")
    return decoded


def _hex32(text: str) -> bytes | None:
    """64 lowercase hex digits (32 bytes)"""
    try:
        value = bytes.fromhex(text)
    except ValueError:
        return None
    return value if len(value) == 32 and value.hex() == text else None


def _b64_32(text: str) -> bytes | None:
    """canonical padded base64 of 32 bytes (RFC 4648)"""
    try:
        value = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    ok = len(value) == 32 and base64.b64encode(value).decode("ascii") == text
    return value if ok else None
