"""Checkpoint lines of an ``export --jsonl`` (schema/LOG-FORMAT.md, "Checkpoint lines").

An export carries the store's latest cosigned checkpoints (``ledger_checkpoint``, one row
per origin, written by the collector) so that a restore keeps them: a restored store
serves the same cosigned notes and resumes where its witnesses left it (R29, issue 28
item 7). Each is one line after the event lines and before the trailer, told by the key
``checkpoint`` (whose value is the line kind's version); an export that carries any
ends with a trailer of version 2, which counts them. A reader that does not know the
line kind refuses the file: it cannot restore what it does not read.

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from domain.errors import IntegrityFailure, InvalidInput
from domain.notes import Checkpoint

MARKER = "checkpoint"
VERSION = 1
FIELDS = (MARKER, "origin", "size", "root", "note", "stored_at_us")
_MAX_INT = 2**63 - 1


@dataclass(frozen=True)
class CheckpointLine:
    """One stored cosigned checkpoint: ``note`` is the whole note as stored (body, blank
    line, the log's signature line, the witnesses' cosignature lines)."""

    origin: str
    size: int
    root: bytes
    note: str
    stored_at_us: int

    def to_json(self) -> dict[str, Any]:
        return {
            MARKER: VERSION,
            "origin": self.origin,
            "size": self.size,
            "root": base64.b64encode(self.root).decode("ascii"),
            "note": self.note,
            "stored_at_us": self.stored_at_us,
        }

    @classmethod
    def parse(cls, doc: dict[str, Any], *, line: int) -> CheckpointLine:
        """A checkpoint line's fields, typed, and its note's body saying the same origin,
        size and root. A wrong JSON type, a missing or an unknown key is INVALID naming
        ``checkpoint.<key>``; another line version or a note that says otherwise is
        INTEGRITY."""
        version = doc[MARKER]
        if type(version) is not int or version != VERSION:
            raise IntegrityFailure(
                f"line {line}: checkpoint line version {version!r} is not one this release "
                f"reads ({VERSION}); nothing was imported",
                line=line,
                field=f"{MARKER}.{MARKER}",
                check="checkpoint",
            )
        unknown = sorted(set(doc) - set(FIELDS))
        if unknown:
            raise _invalid(line, unknown[0], "is not a checkpoint line field")
        origin, note = _text(doc, "origin", line), _text(doc, "note", line)
        size, stored = _count(doc, "size", line), _count(doc, "stored_at_us", line)
        text = _text(doc, "root", line)
        try:
            root = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            root = b""
        if len(root) != 32 or base64.b64encode(root).decode("ascii") != text:
            raise _invalid(line, "root", "is not canonical padded base64 of 32 bytes")
        try:
            body = Checkpoint.parse(note, field=f"{MARKER}.note")
        except InvalidInput as exc:
            raise InvalidInput(
                f"line {line}: {exc.message}", **{**exc.details, "line": line}
            ) from None
        if (body.origin, body.size, body.root) != (origin, size, root):
            raise IntegrityFailure(
                f"line {line}: the checkpoint line's note says {body.origin} size {body.size}, "
                "not the line's origin, size and root; nothing was imported",
                line=line,
                field=f"{MARKER}.note",
                check="checkpoint",
            )
        return cls(origin, size, root, note, stored)


def is_checkpoint_line(doc: object) -> bool:
    """Whether a parsed export line is a checkpoint line (an object with the marker key)."""
    return isinstance(doc, dict) and MARKER in doc


def _invalid(line: int, key: str, problem: str) -> InvalidInput:
    return InvalidInput(
        f"line {line}: checkpoint line field {key} {problem}", field=f"{MARKER}.{key}", line=line
    )


def _text(doc: dict[str, Any], key: str, line: int) -> str:
    if key not in doc:
        raise _invalid(line, key, "is missing")
    value = doc[key]
    if not isinstance(value, str) or not value:
        raise _invalid(line, key, "must be a non-empty string")
    return value


def _count(doc: dict[str, Any], key: str, line: int) -> int:
    if key not in doc:
        raise _invalid(line, key, "is missing")
    value = doc[key]
    if type(value) is not int or not 0 <= value <= _MAX_INT:
        raise _invalid(line, key, "must be an integer between 0 and 2^63-1")
    return value
