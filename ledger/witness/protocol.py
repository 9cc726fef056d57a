"""C2SP tlog-witness ``add-checkpoint``, as plain data in and out (the HTTP adapter is
``ledger.witness.app``), so every answer of the spec is testable without a socket.

Request body (tlog-witness "add-checkpoint")::

    old <size>\\n
    <base64 hash>\\n          (0 to 63 consistency proof lines)
    \\n
    <signed checkpoint note>

Answers, in the order the spec checks them:

- 400 the body is malformed (the lines above, the note, the checkpoint in it), or
  ``old`` is larger than the checkpoint's size;
- 404 the checkpoint's origin is not a configured log;
- 403 no valid signature by a configured key of that log, or a line by such a key
  (name and key id) that does not verify;
- 409 ``old`` is not the size this witness last cosigned (0 if none):
  ``Content-Type: text/x.tlog.size``, body the known size and a newline;
- 422 size 0 with another root than the empty tree's; a proof sent from size 0; a
  consistency proof that does not verify from the kept tree; the kept size with
  another root (the last two are kept as evidence);
- 200 the witness's ``cosignature/v1`` line, newline-terminated, after the new state
  is committed.

``GET /<hex SHA-256 of the origin>/checkpoint`` (the spec's monitoring retrieval)
answers the last cosigned note, the log's signatures and this witness's cosignature
on it, or 404.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from domain.errors import InvalidInput, LedgerError
from domain.notes import (
    Checkpoint,
    SignedNote,
    VerifierKey,
    WitnessSigner,
    verify_log_signatures,
)
from ledger.observability import get_logger
from ledger.witness.state import Clock, SizeMismatch, Unprocessable, WitnessState

MAX_BODY = 64 * 1024
"""Largest request body read: 63 proof lines and a checkpoint with 100 signatures fit."""

MAX_PROOF_LINES = 63
SIZE_CONTENT_TYPE = "text/x.tlog.size"
_TEXT = "text/plain; charset=utf-8"
_MAX_SIZE = 2**63 - 1
_OLD = re.compile(r"old (0|[1-9][0-9]{0,19})")
_log = get_logger("witness")


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: status, content type, body text."""

    status: int
    body: str
    content_type: str = _TEXT


@dataclass(frozen=True)
class AddCheckpoint:
    old_size: int
    proof: tuple[bytes, ...]
    note: str
    checkpoint: Checkpoint


def parse_add_checkpoint(body: bytes) -> AddCheckpoint:
    """The request body, or INVALID naming what is malformed (HTTP 400)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("the request body is not UTF-8", field="body") from None
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise InvalidInput("no blank line before the checkpoint", field="body")
    lines = head.split("\n")
    old = _OLD.fullmatch(lines[0])
    if old is None or int(old.group(1)) >= 2**64:
        raise InvalidInput("the first line is not `old <size>`", field="old")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise InvalidInput(f"more than {MAX_PROOF_LINES} consistency proof lines", field="proof")
    proof = []
    for index, line in enumerate(lines[1:]):
        try:
            node = base64.b64decode(line, validate=True)
        except ValueError:
            node = b""
        if len(node) != 32:
            raise InvalidInput(f"proof line {index + 1} is not a base64 hash", field="proof")
        proof.append(node)
    parsed = SignedNote.parse(note, field="checkpoint")
    checkpoint = Checkpoint.parse(parsed.text, field="checkpoint")
    body_lines = parsed.text.split("\n")
    if body_lines[1] != str(checkpoint.size) or "" in body_lines[:-1]:
        raise InvalidInput(
            "the checkpoint's size has leading zeroes, or it has an empty line",
            field="checkpoint",
        )
    if checkpoint.size > _MAX_SIZE:
        # The state file keeps sizes as SQLite integers (signed 64-bit): refused here,
        # not a crash on the write after the log's signature was checked.
        raise InvalidInput(
            f"the checkpoint's size is past {_MAX_SIZE}, more than this witness keeps",
            field="checkpoint",
        )
    return AddCheckpoint(int(old.group(1)), tuple(proof), note, checkpoint)


class Witness:
    """A witness: its key, the logs it follows (origin -> log keys), its state, its clock."""

    def __init__(
        self,
        state: WitnessState,
        signer: WitnessSigner,
        logs: Mapping[str, Sequence[VerifierKey]],
        clock: Clock,
    ) -> None:
        self.state = state
        self.signer = signer
        self.logs = {origin: tuple(keys) for origin, keys in logs.items()}
        self.clock = clock
        self._by_hash = {hashlib.sha256(o.encode()).hexdigest(): o for o in self.logs}

    def add_checkpoint(self, body: bytes) -> Answer:
        try:
            request = parse_add_checkpoint(body)
        except InvalidInput as exc:
            return self._refuse(400, exc.message, origin=None)
        origin = request.checkpoint.origin
        keys = self.logs.get(origin)
        if keys is None:
            return self._refuse(404, f"unknown log origin {origin!r}", origin=origin)
        try:
            verify_log_signatures(request.note, keys)
        except LedgerError as exc:
            return self._refuse(403, exc.message, origin=origin)
        if request.old_size > request.checkpoint.size:
            return self._refuse(400, "old is larger than the checkpoint's size", origin=origin)
        body_text = SignedNote.parse(request.note).text
        try:
            cosigned = self.state.advance(
                request.checkpoint,
                request.note,
                request.old_size,
                request.proof,
                cosign=lambda timestamp: self.signer.cosign(body_text, timestamp),
                clock=self.clock,
            )
        except SizeMismatch as exc:
            _log.info(
                "witness: old size does not match",
                extra={"origin": origin, "old": request.old_size, "known": exc.known},
            )
            return Answer(409, f"{exc.known}\n", SIZE_CONTENT_TYPE)
        except Unprocessable as exc:
            if exc.evidence is not None:
                _log.warning(
                    "witness: refused a checkpoint inconsistent with the cosigned tree",
                    extra={"origin": origin, "reason": exc.reason, "evidence": exc.evidence},
                )
            return self._refuse(422, exc.message, origin=origin)
        except LedgerError as exc:  # the file unusable, not a witness file, edited
            return self._refuse(503, exc.message, origin=origin)
        _log.info(
            "witness: cosigned",
            extra={
                "origin": origin,
                "size": request.checkpoint.size,
                "timestamp": cosigned.timestamp,
            },
        )
        return Answer(200, cosigned.line + "\n")

    def checkpoint(self, origin_hash: str) -> Answer:
        origin = self._by_hash.get(origin_hash)
        try:
            known = None if origin is None else self.state.known(origin)
        except LedgerError as exc:  # the file unusable, not a witness file, edited
            return self._refuse(503, exc.message, origin=origin)
        if known is None:
            return Answer(404, "this witness has cosigned no checkpoint of that log\n")
        return Answer(200, known.note)

    def _refuse(self, status: int, message: str, *, origin: str | None) -> Answer:
        _log.info("witness: refused", extra={"status": status, "origin": origin})
        return Answer(status, message.rstrip("\n") + "\n")
