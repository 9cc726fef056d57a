"""The log side of C2SP tlog-witness: submit a signed checkpoint to a witness and get
its cosignature lines (the collector, ``catalog-ledger cosign``, calls this).

``add_checkpoint`` makes one request and maps every answer of the spec to a typed
result: 200 the cosignature lines; 409 ``SizeConflict`` carrying the size the witness
last cosigned (retry from it, with a consistency proof from that size); 400, 403, 404,
422 and any other refusal INTEGRITY ``witness_refused`` with the status and the
witness's message (the witness will not cosign this: a fork, a bad signature, an
unknown log); network failures, timeouts and 5xx UNAVAILABLE (try again later).
``cosign_checkpoint`` does the 409 round trip for the caller.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import httpx

from domain import errors
from domain.errors import IntegrityFailure, Unavailable
from domain.notes import (
    Checkpoint,
    NoteSignature,
    SignedNote,
    WitnessKey,
)

SIZE_CONTENT_TYPE = "text/x.tlog.size"


class SizeConflict(errors.Conflict):
    """409: ``old`` was not the size the witness last cosigned, ``known_size``."""

    def __init__(self, url: str, known_size: int) -> None:
        super().__init__(
            f"the witness at {url} last cosigned size {known_size}",
            witness=url,
            known_size=known_size,
        )
        self.known_size = known_size


@contextmanager
def submitter(
    timeout: float = 10.0,
) -> Iterator[Callable[[str, str, int, Sequence[bytes]], list[str]]]:
    """``add_checkpoint`` for one collector run: one HTTP client for every witness and
    checkpoint of the run (one TLS context, connections kept), closed after it."""
    with httpx.Client(timeout=timeout) as client:

        def submit(url: str, note: str, old_size: int, proof: Sequence[bytes]) -> list[str]:
            return add_checkpoint(url, note, old_size, proof, timeout=timeout, client=client)

        yield submit


def request_body(note: str, old_size: int, proof: Sequence[bytes]) -> bytes:
    """The ``add-checkpoint`` body: ``old <size>``, the proof lines, a blank line, the note."""
    lines = [f"old {old_size}", *(base64.b64encode(h).decode() for h in proof)]
    return ("\n".join(lines) + "\n\n" + note).encode()


def add_checkpoint(
    url: str,
    note: str,
    old_size: int,
    proof: Sequence[bytes],
    *,
    key: WitnessKey | None = None,
    timeout: float = 10.0,
    client: httpx.Client | None = None,
) -> list[str]:
    """Submit the signed checkpoint ``note`` to the witness whose submission prefix is
    ``url``, from ``old_size`` with the consistency ``proof``; the cosignature lines it
    answers (no final newlines).

    With ``key`` (the witness's pinned ``cosignature/v1`` key) only the lines by that
    key are returned, each verified against the checkpoint: a line by it that does not
    verify, or no line by it, is INTEGRITY ``bad_cosignature``.
    """
    body = SignedNote.parse(note, field="checkpoint").text
    target = url.rstrip("/") + "/add-checkpoint"
    try:
        if client is not None:
            answer = client.post(target, content=request_body(note, old_size, proof))
        else:
            with httpx.Client(timeout=timeout) as own:
                answer = own.post(target, content=request_body(note, old_size, proof))
    except httpx.HTTPError as exc:
        raise Unavailable(
            f"the witness at {url} did not answer: {type(exc).__name__}: {exc}", witness=url
        ) from None
    if answer.status_code == 200:
        return _cosignatures(url, answer.text, body, key)
    if answer.status_code == 409:
        kind = answer.headers.get("content-type", "").split(";")[0].strip()
        size = answer.text.removesuffix("\n")
        if kind == SIZE_CONTENT_TYPE and size.isascii() and size.isdigit():
            raise SizeConflict(url, int(size))
    if answer.status_code >= 500:
        raise Unavailable(
            f"the witness at {url} failed: HTTP {answer.status_code}",
            witness=url,
            status=answer.status_code,
        )
    raise IntegrityFailure(
        f"the witness at {url} refused the checkpoint (HTTP {answer.status_code}): "
        f"{answer.text.strip()[:300]}",
        reason="witness_refused",
        witness=url,
        status=answer.status_code,
    )


def _cosignatures(url: str, text: str, body: str, key: WitnessKey | None) -> list[str]:
    lines = text.split("\n")
    if not text.endswith("\n") or len(lines) < 2:
        raise IntegrityFailure(
            f"the witness at {url} answered no signature lines", reason="bad_cosignature"
        )
    signatures = []
    for line in lines[:-1]:
        try:
            signatures.append(NoteSignature.parse_line(line, field="cosignature"))
        except errors.InvalidInput:
            raise IntegrityFailure(
                f"the witness at {url} answered a line that is not a note signature",
                reason="bad_cosignature",
                witness=url,
            ) from None
    if key is None:
        return [s.line() for s in signatures]
    mine = [s for s in signatures if key.signed(s)]
    if not mine:
        raise IntegrityFailure(
            f"the witness at {url} answered no cosignature by {key.name}",
            reason="bad_cosignature",
            witness=url,
        )
    for signature in mine:
        key.verify(body, signature)
    return [s.line() for s in mine]


def cosign_checkpoint(
    url: str,
    note: str,
    proof_from: Callable[[int], Sequence[bytes]],
    *,
    old_size: int = 0,
    key: WitnessKey | None = None,
    timeout: float = 10.0,
    client: httpx.Client | None = None,
) -> list[str]:
    """``add_checkpoint``, retried from the size a 409 names (at most three tries).

    ``proof_from(size)`` is the consistency proof from ``size`` to the note's checkpoint
    (empty for size 0 or the same size). A witness that knows a *larger* size than the
    checkpoint's keeps its ``SizeConflict``: this log is behind what it already
    cosigned (a restored backup, a rollback), and no proof can exist.
    """
    size = Checkpoint.parse(SignedNote.parse(note, field="checkpoint").text).size
    for attempt in range(3):
        proof = [] if old_size in (0, size) else list(proof_from(old_size))
        try:
            return add_checkpoint(
                url, note, old_size, proof, key=key, timeout=timeout, client=client
            )
        except SizeConflict as conflict:
            if conflict.known_size > size or attempt == 2:
                raise
            old_size = conflict.known_size
    raise AssertionError("unreachable")  # pragma: no cover
