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
keys). ``rotation_in_log`` checks that a statement is in a (cosigned) checkpoint's tree;
``apply_rotation`` is the whole rule a client (or an auditor) applies to its pinned key
set. Pure: no I/O, no clock (``now`` is an argument).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID

from domain import merkle
from domain.digests import event_id
from domain.errors import IntegrityFailure, InvalidInput
from domain.notes import (
    Checkpoint,
    SignedNote,
    SignerKey,
    VerifierKey,
    WitnessKey,
    note_signers,
    verify_log_signatures,
    witnessed_times,
)
from domain.origin import check_origin, log_identity_id

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
    try:
        parsed = SignedNote.parse(note, field="statement")
    except InvalidInput:
        raise IntegrityFailure("the key rotation is not signed", reason="no_signature") from None
    if not note_signers(parsed, [key]):
        raise IntegrityFailure(
            f"the key rotation has no signature by its old key {key.name}",
            reason="no_signature",
        )


@dataclass(frozen=True)
class StoredRotation:
    """A ``log_key.rotated`` event as stored (LOG-FORMAT "Row fields"), for a client that is
    shown it with an inclusion proof under a cosigned checkpoint of the main log."""

    aggregate_id: bytes
    version: int
    topic: bytes
    state: bytes


def rotation_in_log(
    event: StoredRotation, leaf_index: int, proof: list[bytes], checkpoint: Checkpoint
) -> str:
    """The rotation statement ``event`` holds, if ``event`` is in the log ``checkpoint``
    commits to (the RFC 9162 inclusion ``proof`` of its event id at ``leaf_index``): the
    witnesses that cosigned ``checkpoint`` then vouch that every client sees this rotation.
    The checkpoint's signature and cosignatures are checked by the caller, as for any
    checkpoint. INTEGRITY ``not_a_rotation`` for another event, ``bad_inclusion`` when the
    proof does not verify."""
    topic = event.topic.decode("utf-8", "replace")
    try:
        state = json.loads(event.state)
    except ValueError:
        state = None
    ok = (
        event.aggregate_id == log_identity_id().bytes
        and topic.rpartition("@")[0] == "log_key.rotated"
        and isinstance(state, dict)
        and isinstance(state.get("statement"), str)
    )
    if not ok or not isinstance(state, dict):
        raise IntegrityFailure(
            "the event is not a log_key.rotated event of the log identity",
            reason="not_a_rotation",
        )
    ident = event_id(event.aggregate_id, event.version, event.topic, event.state)
    try:
        merkle.verify_inclusion(
            leaf_index, checkpoint.size, merkle.leaf_hash(ident), proof, checkpoint.root
        )
    except IntegrityFailure:
        raise IntegrityFailure(
            f"the rotation event is not at leaf {leaf_index} of the checkpoint's tree",
            reason="bad_inclusion",
        ) from None
    return str(state["statement"])


# -- learning rotations from the log (GET /v1/log/rotations) ---------------------------


def learn_rotations(
    pinned: Iterable[VerifierKey | PinnedKey],
    document: object,
    *,
    origin: str,
    witnesses: Iterable[WitnessKey],
    threshold: int,
    now: int,
) -> tuple[PinnedKey, ...]:
    """The key set after the rotations of ``document`` (the body of ``GET
    /v1/log/rotations``: the stored cosigned main-log note and each ``log_key.rotated``
    event as stored, with its inclusion proof under that note), or INTEGRITY (nothing
    changes).

    In order: the note is a checkpoint of the main log ``origin`` (``wrong_origin``),
    signed by a pinned key valid at ``now`` (``bad_signature``, ``no_signature``) and
    cosigned by at least ``threshold`` distinct pinned ``witnesses`` (``bad_cosignature``,
    ``too_few_cosignatures``): the witnesses then vouch that every client is shown these
    rotations. Each event must be in that tree (``rotation_in_log``: ``not_a_rotation``,
    ``bad_inclusion``); a rotation whose new key is pinned already (learned before, or
    pinned out of band) only bounds its old key by ``until`` if it was not already; any
    other is ``apply_rotation``'s to apply (its old key pinned and valid, its overlap not
    over: ``not_pinned``, ``expired``, ...). A body
    not shaped like one is INTEGRITY ``malformed_rotations`` naming the JSON path."""
    keys = tuple(k if isinstance(k, PinnedKey) else PinnedKey(k) for k in pinned)
    note, events = _parse_rotations(document)
    if not events:
        return keys
    if note is None:
        raise _malformed("not a checkpoint note", "$.checkpoint")
    try:
        checkpoint = Checkpoint.parse(note.partition("\n\n")[0] + "\n", field="$.checkpoint")
    except InvalidInput as exc:
        raise _malformed(exc.message, "$.checkpoint") from None
    if checkpoint.origin != origin:
        raise IntegrityFailure(
            f"the main-log checkpoint's origin is {checkpoint.origin!r}, not {origin!r}",
            reason="wrong_origin",
            origin=checkpoint.origin,
        )
    valid_keys = [k.key for k in keys if k.valid_at(now)]
    try:
        verify_log_signatures(note, valid_keys, field="$.checkpoint")
        witnessed_times(
            note,
            witnesses,
            threshold,
            field="$.checkpoint",
            what="the main-log checkpoint that covers the key rotations",
        )
    except InvalidInput as exc:
        raise _malformed(exc.message, "$.checkpoint") from None
    for event, leaf_index, proof in events:
        statement = rotation_in_log(event, leaf_index, proof, checkpoint)
        try:
            rotation = Rotation.parse(statement)
        except InvalidInput as exc:
            raise IntegrityFailure(exc.message, reason="malformed_rotation") from None
        if any(k.key.public == rotation.new.public for k in keys):
            keys = _bound(keys, rotation, statement)
            continue
        keys = apply_rotation(keys, statement, origin=origin, now=now)
    return keys


def _bound(
    keys: tuple[PinnedKey, ...], rotation: Rotation, statement: str
) -> tuple[PinnedKey, ...]:
    """A rotation whose new key is pinned already (learned before, or pinned by a new
    policy): its old key, if pinned with a later end or none, ends at ``until`` (the
    statement signed by that key: it only ever narrows what is trusted)."""
    found = [
        k
        for k in keys
        if k.key.public == rotation.old.public
        and k.key.name == rotation.old.name
        and (k.until is None or k.until > rotation.until)
    ]
    if not found:
        return keys
    check_signature(found[0].key, statement)
    return tuple(PinnedKey(k.key, rotation.until) if k in found else k for k in keys)


_Event = tuple[StoredRotation, int, list[bytes]]


def _parse_rotations(document: object) -> tuple[str | None, list[_Event]]:
    if not isinstance(document, dict) or document.get("format") != 1:
        raise _malformed("not a key rotations document of format 1", "$")
    note, items = document.get("checkpoint"), document.get("rotations")
    if not isinstance(items, list):
        raise _malformed("not a list", "$.rotations")
    if items and not isinstance(note, str):
        raise _malformed("not a checkpoint note", "$.checkpoint")
    events: list[_Event] = []
    for n, item in enumerate(items):
        at = f"$.rotations[{n}]"
        event = item.get("event") if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(event, dict):
            raise _malformed("has no event", f"{at}.event")
        leaf, version = item.get("leaf_index"), event.get("version")
        topic, state = event.get("topic"), event.get("state_b64")
        aggregate = event.get("aggregate_id")
        proof = item.get("inclusion")
        try:
            ok = (
                type(leaf) is int
                and leaf >= 0
                and type(version) is int
                and 1 <= version < 1 << 63
                and isinstance(topic, str)
                and isinstance(aggregate, str)
                and isinstance(state, str)
                and isinstance(proof, list)
                and len(proof) <= 64
            )
            if not ok or not isinstance(state, str) or not isinstance(proof, list):
                raise ValueError("wrong types")
            hashes = [base64.b64decode(p, validate=True) for p in proof]
            if any(len(h) != 32 for h in hashes):
                raise ValueError("not 32-byte hashes")
            stored = StoredRotation(
                UUID(str(aggregate)).bytes,
                int(str(version)),
                str(topic).encode("utf-8", "surrogateescape"),
                base64.b64decode(state, validate=True),
            )
        except (ValueError, TypeError, binascii.Error):
            raise _malformed("is not a stored event with its inclusion proof", at) from None
        events.append((stored, int(str(leaf)), hashes))
    return (note if isinstance(note, str) else None), events


def _malformed(message: str, field: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"the key rotations are malformed: {field}: {message}",
        reason="malformed_rotations",
        field=field,
    )
